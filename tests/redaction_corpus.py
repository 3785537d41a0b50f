"""A generated corpus for measuring the redactor: positives (text holding one named secret)
and negatives (ordinary tool output that must come back byte for byte).

No real secret is anywhere in this file: every value is drawn at run time from a seeded
random generator, and token prefixes are glued from pieces, so the file itself holds no
token-shaped string. `positives()` gives (kind, text, secret) triples; `negatives()` gives
(kind, text) pairs. `leaks(secret, text, out)` is the recall test: the secret is gone and
neither its first nor its last few characters were left behind (a value cut short).

tests/test_redaction.py asserts the targets; tests/bench_redaction.py prints the figures
side by side with the seed's six patterns.
"""
import base64
import json
import random
import string
from urllib.parse import quote

ALNUM = string.ascii_letters + string.digits
LOWER = string.ascii_lowercase + string.digits
HEX = "0123456789abcdef"
B64 = ALNUM + "+/"
URLSAFE = ALNUM + "-_"
UPPER32 = string.ascii_uppercase + "234567"


class Gen:
    """Seeded random values that look like secrets (a digit, an upper- and a lower-case
    letter whenever the alphabet has them), and ordinary values (ids, versions, hashes)."""

    def __init__(self, seed):
        self.rng = random.Random(seed)

    def s(self, n, alphabet=ALNUM):
        rng = self.rng
        while True:
            v = "".join(rng.choice(alphabet) for _ in range(n))
            if alphabet != ALNUM or n < 6 or (any(c.isdigit() for c in v) and v.lower() != v != v.upper()):
                return v

    def pick(self, seq):
        return self.rng.choice(seq)

    def num(self, a, b):
        return self.rng.randint(a, b)

    def word(self):
        return self.pick(WORDS)

    def password(self):
        """Passwords as people write them: words, digits, and characters legal in passwords."""
        w = self.pick(["Passw0rd", "SuperSecret", "MySecretValue", "monkey", "keystone", "Tr0ub4dor",
                       "Summer", "Dragon", "tokenHolder", "Authz", "pwdReset", "Welcome", "Qwerty",
                       "correcthorse", "Secr3tKey", "AdminPass", "s3cr3t"])
        tail = self.s(self.num(3, 6))
        sep = self.pick(["", "", "", "&", "#", "?", "%", "+", "/", "!", "@", "$", "^", "*", "-", "=", "~"])
        return w + str(self.num(1, 2099)) + sep + tail

    def sha(self, n=40):
        return self.s(n, HEX)

    def uuid(self):
        h = self.s(32, HEX)
        return "%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])

    def version(self):
        return "%d.%d.%d" % (self.num(0, 12), self.num(0, 40), self.num(0, 99))

    def b64(self, raw):
        return base64.b64encode(raw).decode()


WORDS = ("build deploy cache worker queue retry module compile link release artifact runner "
         "service gateway billing payments search index users orders inventory metrics auth "
         "session token key secret monkey keystone api client server").split()

# Token prefixes, split so that this file holds no token-shaped literal.
P = {name: "".join(parts) for name, parts in {
    "ghp": ("gh", "p_"), "gho": ("gh", "o_"), "ghs": ("gh", "s_"), "ghu": ("gh", "u_"),
    "ghr": ("gh", "r_"), "ghfg": ("github", "_pat_"), "glpat": ("gl", "pat-"), "glrt": ("gl", "rt-"),
    "gldt": ("gl", "dt-"), "glptt": ("gl", "ptt-"), "glcbt": ("gl", "cbt-"), "glimt": ("gl", "imt-"),
    "glagent": ("gl", "agent-"), "gloas": ("gl", "oas-"), "glsoat": ("gl", "soat-"), "glffct": ("gl", "ffct-"),
    "glft": ("gl", "ft-"), "grr": ("GR13", "48941"),
    "xoxb": ("xo", "xb-"), "xoxp": ("xo", "xp-"), "xapp": ("xa", "pp-"), "xoxe": ("xo", "xe-"),
    "akia": ("AK", "IA"), "asia": ("AS", "IA"), "aiza": ("AI", "za"),
    "sklive": ("sk_", "live_"), "sktest": ("sk_", "test_"), "rklive": ("rk_", "live_"),
    "skproj": ("sk-", "proj-"), "skant": ("sk-", "ant-api03-"), "skadm": ("sk-", "ant-admin01-"),
    "t3": ("T3Bl", "bkFJ"), "npm": ("np", "m_"), "pypi": ("pypi-", "AgEIcHlwaS5vcmc"),
    "sg": ("S", "G."), "twsk": ("S", "K"), "twac": ("A", "C"), "mgkey": ("ke", "y-"),
    "sqat": ("sq0", "atp-"), "eaaa": ("EA", "AA"), "pstkn": ("pscale", "_tkn_"), "pspw": ("pscale", "_pw_"),
    "psoa": ("pscale", "_oauth_"), "fo1": ("fo", "1_"), "fm2": ("fm", "2_"), "sntryu": ("sntry", "u_"),
    "sntrys": ("sntrys_", "eyJpYXQiO"), "glsa": ("gl", "sa_"), "glc": ("gl", "c_"), "grfk": ("eyJr", "Ijoi"),
    "cfca": ("v1", ".0-"), "sbp": ("sb", "p_"), "sbsec": ("sb_", "secret_"), "dapi": ("da", "pi"),
    "dop": ("dop", "_v1_"), "doo": ("doo", "_v1_"), "dor": ("dor", "_v1_"), "shpat": ("shp", "at_"),
    "shpss": ("shp", "ss_"), "hvs": ("hv", "s."), "hvb": ("hv", "b."), "dppt": ("dp", ".pt."),
    "lin": ("lin", "_api_"), "ntn": ("nt", "n_"), "atatt": ("ATA", "TT3"), "hrku": ("HRKU", "-AA"),
    "pmak": ("PM", "AK-"), "age": ("AGE-SECRET", "-KEY-1"), "pul": ("pu", "l-"), "pplx": ("pp", "lx-"),
    "dt": ("dt0", "c01."), "xkeysib": ("xkey", "sib-"), "rubygems": ("rubygems", "_"), "pnu": ("pn", "u_"),
    "rdme": ("rd", "me_"), "shippo": ("shippo", "_live_"), "tfp": ("tf", "p_"), "clojars": ("CLOJ", "ARS_"),
    "duffel": ("duffel", "_live_"), "ezak": ("EZ", "AK"), "fio": ("fio", "-u-"), "flw": ("FLWSECK", "_TEST-"),
    "ico": ("ic", "o-"), "osh": ("sha256", "~"), "octo": ("AP", "I-"), "akcp": ("AK", "Cp"),
    "cmvmd": ("cmV", "md"), "ltai": ("LT", "AI"), "p8e": ("p8", "e-"), "dnkey": ("dn", "key-"),
    "atlas": (".atlas", "v1."), "opsj": ("ops_", "eyJ"), "a3": ("A", "3-"), "hf": ("h", "f_"),
    "hforg": ("api_", "org_"), "dckr": ("dckr", "_pat_"), "gsk": ("gs", "k_"), "xai": ("xa", "i-"),
    "r8": ("r", "8_"), "sgp": ("sg", "p_"), "absk": ("AB", "SK"), "nrak": ("NR", "AK-"), "nrii": ("NR", "II-"),
    "sm": ("sm_", "pat_"), "tkus": ("tk-", "us-"), "s4t2": ("s-s4", "t2ud-"), "ch4b": ("4b", "1d"),
    "mmk": ("_m", "mk"), "whsec": ("wh", "sec_"), "ya29": ("ya", "29."), "skor": ("sk-or", "-v1-"),
    "nvapi": ("nva", "pi-"), "eaam": ("EA", "AM"), "sqp": ("sq", "p_"), "pk": ("p", "k."),
    "harn": ("pa", "t."), "airpat": ("p", "at"), "authress": ("sc", "_"), "bedrock": ("bedrock-api-key-", "YmVkcm9jay5hbWF6b25hd3MuY29t"),
}.items()}


def _pem(g, kind="RSA "):
    body = "\n".join(g.s(64, B64) for _ in range(6)) + "\n" + g.s(20, B64) + "=="
    return ("-----BEGIN %sPRIVATE KEY-----\n%s\n-----END %sPRIVATE KEY-----\n" % (kind, body, kind)), body


def _jwt(g):
    head = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').decode().rstrip("=")
    body = base64.urlsafe_b64encode(json.dumps({"sub": g.s(12), "iat": g.num(10**9, 2 * 10**9)}).encode()).decode().rstrip("=")
    return "%s.%s.%s" % (head, body, g.s(43, URLSAFE))


def token_kinds(g):
    """(kind, token) for every token format with a prefix or shape of its own."""
    s = g.s
    hx = lambda n: s(n, HEX)
    return [
        ("github-pat", P["ghp"] + s(36)), ("github-oauth", P["gho"] + s(36)),
        ("github-app", P["ghs"] + s(36)), ("github-user", P["ghu"] + s(36)),
        ("github-refresh", P["ghr"] + s(36)),
        ("github-fine-grained", P["ghfg"] + s(22) + "_" + s(59)),
        ("gitlab-pat", P["glpat"] + s(20, URLSAFE)),
        ("gitlab-pat-routable", P["glpat"] + s(40, URLSAFE) + "." + s(2, LOWER) + s(7, LOWER)),
        ("gitlab-runner", P["glrt"] + s(20, URLSAFE)), ("gitlab-deploy", P["gldt"] + s(20, URLSAFE)),
        ("gitlab-ptt", P["glptt"] + hx(40)), ("gitlab-cicd-job", P["glcbt"] + s(3) + "_" + s(20, URLSAFE)),
        ("gitlab-mail", P["glimt"] + s(25, URLSAFE)), ("gitlab-agent", P["glagent"] + s(50, URLSAFE)),
        ("gitlab-oauth", P["gloas"] + s(64, URLSAFE)), ("gitlab-scim", P["glsoat"] + s(20, URLSAFE)),
        ("gitlab-ffc", P["glffct"] + s(20, URLSAFE)), ("gitlab-feed", P["glft"] + s(20, URLSAFE)),
        ("gitlab-runner-registration", P["grr"] + s(20, URLSAFE)),
        ("slack-bot", P["xoxb"] + s(12, string.digits) + "-" + s(13, string.digits) + "-" + s(24)),
        ("slack-user", P["xoxp"] + "-".join(s(12, string.digits) for _ in range(3)) + "-" + s(32, HEX)),
        ("slack-app", P["xapp"] + "1-" + s(11, string.ascii_uppercase + string.digits) + "-" + s(13, string.digits) + "-" + s(64, HEX)),
        ("slack-config-refresh", P["xoxe"] + "1-" + s(146, string.ascii_uppercase + string.digits)),
        ("aws-access-key-id", P["akia"] + s(15, UPPER32) + s(1, "234567")),
        ("aws-sts-key-id", P["asia"] + s(15, UPPER32) + s(1, "234567")),
        ("gcp-api-key", P["aiza"] + "Sy" + s(33, URLSAFE)),
        ("stripe-live", P["sklive"] + "51" + s(97)), ("stripe-test", P["sktest"] + s(24)),
        ("stripe-restricted", P["rklive"] + s(24)), ("stripe-webhook", P["whsec"] + s(32)),
        ("openai-project", P["skproj"] + s(74, URLSAFE) + P["t3"] + s(74, URLSAFE)),
        ("openai-legacy", "sk-" + s(20) + P["t3"] + s(20)),
        ("anthropic-api", P["skant"] + s(93, URLSAFE) + "AA"), ("anthropic-admin", P["skadm"] + s(93, URLSAFE) + "AA"),
        ("openrouter", P["skor"] + hx(64)),
        ("npm", P["npm"] + s(36)), ("pypi", P["pypi"] + s(70, URLSAFE)),
        ("sendgrid", P["sg"] + s(22, URLSAFE) + "." + s(43, URLSAFE)),
        ("twilio-api-key", P["twsk"] + hx(32)),
        ("mailgun-private", P["mgkey"] + hx(32)),
        ("square-access", P["sqat"] + s(22, URLSAFE)), ("square-eaaa", P["eaaa"] + s(60, URLSAFE)),
        ("planetscale-token", P["pstkn"] + s(43, URLSAFE)), ("planetscale-password", P["pspw"] + s(43, URLSAFE)),
        ("planetscale-oauth", P["psoa"] + s(43, URLSAFE)),
        ("flyio-org", P["fo1"] + s(43, URLSAFE)), ("flyio-macaroon", P["fm2"] + s(120, B64) + "=="),
        ("sentry-user", P["sntryu"] + hx(64)),
        ("sentry-org", P["sntrys"] + s(30, B64) + "LCJyZWdpb25fdXJs" + s(30, B64) + "_" + s(43, B64)),
        ("grafana-service-account", P["glsa"] + s(32) + "_" + hx(8)), ("grafana-cloud", P["glc"] + s(80, B64) + "=="),
        ("grafana-api-key", P["grfk"] + s(80)),
        ("cloudflare-origin-ca", P["cfca"] + hx(24) + "-" + hx(146)),
        ("supabase-pat", P["sbp"] + hx(40)), ("supabase-secret", P["sbsec"] + s(32, URLSAFE)),
        ("databricks", P["dapi"] + hx(32)), ("digitalocean-pat", P["dop"] + hx(64)),
        ("digitalocean-oauth", P["doo"] + hx(64)), ("digitalocean-refresh", P["dor"] + hx(64)),
        ("shopify-access", P["shpat"] + hx(32)), ("shopify-shared-secret", P["shpss"] + hx(32)),
        ("vault-service", P["hvs"] + s(95, URLSAFE)), ("vault-batch", P["hvb"] + s(150, URLSAFE)),
        ("doppler", P["dppt"] + s(43)), ("linear", P["lin"] + s(40)),
        ("notion", P["ntn"] + s(11, string.digits) + s(35)), ("atlassian", P["atatt"] + s(186, URLSAFE + "=")),
        ("heroku-v2", P["hrku"] + s(58, URLSAFE)), ("postman", P["pmak"] + hx(24) + "-" + hx(34)),
        ("age-secret-key", P["age"] + s(58, "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L")), ("pulumi", P["pul"] + hx(40)),
        ("perplexity", P["pplx"] + s(48)), ("dynatrace", P["dt"] + s(24, string.ascii_uppercase + string.digits) + "." + s(64, string.ascii_uppercase + string.digits)),
        ("brevo", P["xkeysib"] + hx(64) + "-" + s(16)), ("rubygems", P["rubygems"] + hx(48)),
        ("prefect", P["pnu"] + s(36)), ("readme", P["rdme"] + s(70, LOWER)),
        ("shippo", P["shippo"] + hx(40)), ("typeform", P["tfp"] + s(59, URLSAFE)),
        ("clojars", P["clojars"] + s(60, LOWER)), ("duffel", P["duffel"] + s(43, URLSAFE)),
        ("easypost", P["ezak"] + s(54)), ("frameio", P["fio"] + s(64, URLSAFE)),
        ("flutterwave", P["flw"] + s(32, "abcdefgh0123456789") + "-X"), ("infracost", P["ico"] + s(32)),
        ("openshift", P["osh"] + s(43, URLSAFE)), ("octopus", P["octo"] + s(26, string.ascii_uppercase + string.digits)),
        ("artifactory-api", P["akcp"] + s(69)), ("artifactory-ref", P["cmvmd"] + s(59)),
        ("alibaba-key-id", P["ltai"] + s(20)), ("adobe-secret", P["p8e"] + s(32, LOWER)),
        ("defined-networking", P["dnkey"] + s(26, LOWER) + "-" + s(52, LOWER)),
        ("terraform-cloud", s(14, LOWER) + P["atlas"] + s(64, URLSAFE)),
        ("1password-service", P["opsj"] + s(260, B64) + "="),
        ("1password-secret-key", P["a3"] + s(6, string.ascii_uppercase + string.digits) + "-" + s(11, string.ascii_uppercase + string.digits) + "-" + "-".join(s(5, string.ascii_uppercase + string.digits) for _ in range(3))),
        ("huggingface", P["hf"] + s(34, string.ascii_letters)), ("huggingface-org", P["hforg"] + s(34, string.ascii_letters)),
        ("docker-hub", P["dckr"] + s(27, URLSAFE)), ("groq", P["gsk"] + s(52)), ("xai", P["xai"] + s(80)),
        ("replicate", P["r8"] + s(37)), ("sourcegraph", P["sgp"] + hx(16) + "_" + hx(40)),
        ("bedrock-long-lived", P["absk"] + s(140, B64) + "="),
        ("newrelic-user", P["nrak"] + s(27, string.ascii_uppercase + string.digits)),
        ("newrelic-insert", P["nrii"] + s(32, ALNUM + "-")),
        ("settlemint", P["sm"] + s(16)), ("scalingo", P["tkus"] + s(48, URLSAFE)),
        ("intra42", P["s4t2"] + hx(64)), ("clickhouse", P["ch4b"] + s(38)),
        ("maxmind", s(6) + "_" + s(29) + P["mmk"]), ("google-oauth", P["ya29"] + s(120, URLSAFE)),
        ("nvidia", P["nvapi"] + s(64, URLSAFE)), ("facebook-page", P["eaam"] + s(120)),
        ("sonarqube", P["sqp"] + hx(40)), ("mapbox-secret", "s" + P["pk"][1:] + "eyJ1IjoiY" + s(50) + "." + s(22)),
        ("harness", P["harn"] + s(22, URLSAFE) + "." + s(24) + "." + s(20)),
        ("airtable-pat", P["airpat"] + s(14) + "." + hx(64)),
        ("authress", P["authress"] + s(12, LOWER) + "." + s(5, LOWER) + ".acc_" + s(20, LOWER) + "." + s(60, URLSAFE)),
        ("jwt", _jwt(g)),
        ("telegram-bot", s(10, string.digits) + ":AA" + s(33, URLSAFE)),
        ("discord-bot", "M" + s(23) + "." + s(6, URLSAFE) + "." + s(38, URLSAFE)),
        ("azure-ad-client-secret", s(3) + "8Q~" + s(34, URLSAFE + "~.")),
    ]


def positives(seed=12):
    """[(kind, text, secret)]: `secret` must not survive redact(text), not even in part."""
    g = Gen(seed)
    out = []
    add = lambda kind, text, secret: out.append((kind, text, secret))
    s, pw = g.s, g.password

    # -- tokens with a prefix or shape of their own, in five kinds of surroundings --
    for _ in range(2):
        for kind, tok in token_kinds(g):
            if kind == "discord-bot":    # no prefix of its own: found next to the word discord
                add("token:" + kind, "discord: logging in with %s" % tok, tok)
                continue
            # after a word character only where the prefix alone says token (not Mailgun's
            # `key-`, Infracost's `ico-`: `cache_key-<hex>` is ordinary)
            ctx = g.pick(["remote: using {t} for auth", "export TOKEN_VALUE={t}", '{{"value": "{t}"}}',
                          "echo {t} | tool login --stdin", "notes_{t} end", "[{t}]", "  - {t}",
                          "curl https://api.example.com/v1?x={t}&y=1", "Using '{t}'.", "{t}"])
            if kind in ("mailgun-private", "infracost") and ctx.startswith("notes_"):
                ctx = "note {t} end"
            add("token:" + kind, ctx.format(t=tok), tok)

    # -- values after secret-named keys: values that contain pass/key/token/secret words --
    for _ in range(6):
        v = pw()
        add("kv:password=", "password=%s" % v, v)
        add("kv:DB_PASSWORD", "DB_PASSWORD=%s" % v, v)
        add("kv:client_secret", "client_secret=%s user=ci" % v, v)
        add("kv:api_key", "api_key=%s" % v, v)
        add("kv:yaml-secret", "secret: %s\n  other: 1" % v, v)
        add("kv:json-password", '{"username": "svc", "password": "%s"}' % v, v)
        add("kv:export-token", 'export SERVICE_TOKEN="%s"' % v, v)
        add("kv:compose-env", "      - POSTGRES_PASSWORD=%s\n      - POSTGRES_USER=app" % v, v)
        add("kv:query-param", "GET /login?user=bob&password=%s&next=/home HTTP/1.1" % v.replace("&", "").replace("#", "").replace("?", "").replace("%", "").replace("+", "").replace("/", "").replace("=", ""), v.replace("&", "").replace("#", "").replace("?", "").replace("%", "").replace("+", "").replace("/", "").replace("=", ""))
        add("kv:spaced", "Password = %s" % v, v)
    for ch in "&#?%+/":
        v = "Tr0ub4dor" + ch + s(5)
        add("kv:legal-char-" + ch, "password=%s" % v, v)

    # -- URL userinfo, to the last @ before the host --
    for _ in range(4):
        user = g.pick(["app", "admin", "deploy", "ci"])
        v = pw()
        v2 = "p@ss" + s(6) + g.pick(["#", "&", "?", "/", "+", "%", "@"]) + s(4)
        add("url:userinfo", "DATABASE_URL=postgres://%s:%s@db.internal:5432/app" % (user, v), v)
        add("url:userinfo-specials", "connecting to mysql://%s:%s@10.0.0.%d:3306/shop" % (user, v2, g.num(2, 250)), v2)
        add("url:redis-no-user", "redis://:%s@cache.internal:6379/0" % v, v)
        t = P["ghs"] + s(36)
        add("url:git-clone", "git clone https://x-access-token:%s@github.com/org/repo.git" % t, t)
        v3 = s(16)
        add("url:git-clone-pw", "+ git clone https://%s:%s@gitlab.example.com/group/app.git" % (user, v3), v3)
        add("url:amqp", "amqps://%s:%s@broker.example.com:5671/vhost" % (user, v3), v3)

    # -- credentials as command-line flags --
    for _ in range(4):
        v = pw().replace("'", "")
        q = s(14)
        add("cli:curl-u", "curl -u admin:%s https://api.example.com/v1/items" % q, q)
        add("cli:curl-user", "curl --user 'deploy:%s' -X POST https://ci.example.com/build" % v, v)
        add("cli:curl-user-eq", "curl --user=ci:%s https://nexus.example.com" % q, q)
        add("cli:docker-login-p", "docker login -u ci -p %s registry.example.com" % q, q)
        add("cli:docker-login-password", "docker login --username ci --password %s ghcr.io" % q, q)
        add("cli:mysql-p", "mysql -h db -u root -p%s shop < dump.sql" % q, q)
        add("cli:mysql-password", "mysqldump --user=root --password=%s --all-databases" % q, q)
        add("cli:sshpass", "sshpass -p '%s' ssh deploy@10.0.0.5 uptime" % v, v)
        add("cli:sshpass-bare", "sshpass -p %s scp build.tgz deploy@host:/srv" % q, q)
        add("cli:psql-conninfo", 'psql "host=db.internal port=5432 user=app password=%s dbname=app sslmode=require"' % q, q)
        add("cli:psql-url", "psql postgresql://app:%s@db.internal/app -c 'select 1'" % q, q)
        add("cli:htpasswd", "htpasswd -b -c /etc/nginx/.htpasswd admin %s" % q, q)
        add("cli:htpasswd-B", "htpasswd -bB .htpasswd ci %s" % q, q)
        add("cli:openssl-pass", "openssl pkcs12 -export -in c.pem -out c.p12 -passout pass:%s" % q, q)
        add("cli:openssl-passin", "openssl rsa -in key.pem -passin pass:%s -out plain.pem" % q, q)
        add("cli:openssl-k", "openssl enc -aes-256-cbc -pass pass:%s -in a -out b" % q, q)
        add("cli:redis-cli", "redis-cli -h cache -a %s ping" % q, q)
        add("cli:az-login", "az login --service-principal -u http://ci -p %s --tenant t1" % q, q)
        add("cli:ldapsearch", "ldapsearch -x -D cn=admin,dc=example -w %s -b dc=example" % q, q)
        add("cli:smbclient", "smbclient //fs/share -U deploy%%%s -c ls" % q, q)
        add("cli:ssh-keygen", "ssh-keygen -t ed25519 -N %s -f deploy_key" % q, q)
        add("cli:stdin-docker", "echo %s | docker login -u ci --password-stdin ghcr.io" % q, q)
        add("cli:stdin-gh", "gh auth login --with-token <<< %s" % q, q)
        add("cli:npm-config-set", "npm config set //registry.npmjs.org/:_authToken %s" % q, q)
        add("cli:git-config-token", "git config --global github.token %s" % q, q)
        add("cli:helm-set", "helm upgrade app ./chart --set db.password=%s --set image.tag=%s" % (v, g.version()), v)
        add("cli:kubectl-literal", "kubectl create secret generic db --from-literal=password=%s" % q, q)
        add("cli:java-property", "java -Dspring.datasource.password=%s -jar app.jar" % q, q)
        add("cli:docker-env", "docker run -e AWS_SECRET_ACCESS_KEY=%s -e AWS_REGION=us-east-1 app" % s(40, B64), None)
        out[-1] = (out[-1][0], out[-1][1], out[-1][1].split("=", 1)[1].split(" ")[0])
        add("cli:git-credential", "git -c http.extraheader='AUTHORIZATION: basic %s' fetch" % g.b64(("x:" + q).encode()), g.b64(("x:" + q).encode()))

    # -- configuration formats --
    for _ in range(4):
        v = pw().replace("<", "").replace("&", "").replace('"', "")
        q = s(18)
        add("cfg:xml-element", "    <password>%s</password>" % v, v)
        add("cfg:maven-settings", "<server>\n  <id>nexus</id>\n  <username>ci</username>\n  <password>%s</password>\n</server>" % v, v)
        add("cfg:xml-attribute", '<connection user="app" password="%s" host="db"/>' % v, v)
        add("cfg:nuget", '<add key="ClearTextPassword" value="%s" />' % v, v)
        add("cfg:dotnet-connstr", "Server=tcp:db.example.com,1433;Initial Catalog=app;User ID=sa;Password=%s;Encrypt=True;" % v.replace(";", ""), v.replace(";", ""))
        add("cfg:ini", "[database]\nhost = db.internal\npassword = %s\nport = 5432" % v, v)
        add("cfg:toml", '[registry]\ntoken = "%s"\nurl = "https://r.example.com"' % q, q)
        add("cfg:npmrc-authtoken", "//registry.npmjs.org/:_authToken=%s" % q, q)
        add("cfg:npmrc-auth", "_auth=%s\nalways-auth=true" % g.b64(("ci:" + q).encode()), g.b64(("ci:" + q).encode()))
        add("cfg:pypirc", "[pypi]\nusername = __token__\npassword = %s" % q, q)
        add("cfg:netrc", "machine api.example.com login ci password %s" % q, q)
        add("cfg:netrc-multiline", "machine git.example.com\n  login deploy\n  password %s" % q, q)
        auth = g.b64(("ci:" + q).encode())
        add("cfg:docker-config", '{"auths": {"ghcr.io": {"auth": "%s"}}}' % auth, auth)
        tok = s(40, URLSAFE)
        add("cfg:kubeconfig-token", "users:\n- name: ci\n  user:\n    token: %s" % tok, tok)
        pem, body = _pem(g)
        blob = g.b64(pem.encode())
        add("cfg:kubeconfig-client-key-data", "    client-key-data: %s" % blob, blob)
        add("cfg:yaml-nested", "spring:\n  datasource:\n    password: %s" % v, v)
        add("cfg:properties", "spring.datasource.password=%s" % v, v)
        add("cfg:env-file", "STRIPE_SECRET=%s\nPORT=8080" % q, q)
        add("cfg:secret-key-base", "SECRET_KEY_BASE=%s" % q, q)
        add("cfg:xml-named", '<entry key="password">%s</entry>' % v, v)
        add("cfg:hcl", 'variable "db" {\n  password = "%s"\n}' % v, v)
        add("cfg:terraform-plan", '      + master_password = "%s"' % v, v)

    # -- encoded secrets --
    for _ in range(4):
        pem, body = _pem(g, g.pick(["RSA ", "EC ", "OPENSSH ", ""]))
        blob = g.b64(pem.encode())
        add("enc:base64-pem", "key.b64: %s" % blob, blob)
        tok = P["ghp"] + s(36)
        b = g.b64(tok.encode())
        add("enc:base64-token", "data:\n  GITHUB: %s" % b, b)
        q = s(16)
        add("enc:percent-password", "redirect=%s" % quote("https://u:%s@h.example.com/x" % q, safe=""), q)
        v = pw()
        add("enc:percent-kv", "body=user%%3Dbob%%26password%%3D%s%%26x%%3D1" % quote(v, safe=""), quote(v, safe=""))
        q2 = s(16)
        add("enc:json-escaped", json.dumps(json.dumps({"user": "svc", "password": q2 + '"x'})), q2)
        add("enc:unicode-escaped", '{"password\\u0022: \\u0022%s\\u0022}' % q, q)
        add("enc:unicode-eq", "password\\u003d%s\\u0026next" % q, q)
        pem, body = _pem(g)
        add("enc:pem", pem, body.split("\n")[2])
        add("enc:pem-json", json.dumps({"private_key": pem}), body.split("\n")[1])

    # -- a secret printed alone on the line after a command whose job is to print one --
    for _ in range(4):
        q = s(g.num(16, 40), g.pick([ALNUM, URLSAFE, HEX + "ABCDEF"]))
        for cmd in ("$ kubectl get secret db-creds -o jsonpath='{.data.password}' | base64 -d",
                    "+ vault kv get -field=password secret/ci/db",
                    "$ aws configure get aws_secret_access_key",
                    "$ op read op://ci/db/password",
                    "$ gcloud auth print-access-token",
                    "$ cat /run/secrets/api_token",
                    "$ echo $SECRET_B64 | base64 --decode",
                    "$ gcloud secrets versions access latest --secret=db-password",
                    "$ az keyvault secret show --vault-name kv --name db -o tsv --query value"):
            add("lone:" + cmd.split()[1], "%s\n%s\n$ echo ok" % (cmd, q), q)

    # -- config-given secrets: values of executor.env and friends, in every encoding --
    return out


def config_secret_positives(values, seed=13):
    """(kind, text, secret) for known values (the config's env maps) in each encoding."""
    g = Gen(seed)
    out = []
    for v in values:
        out.append(("known:raw", "agent said: %s done" % v, v))
        out.append(("known:base64", "blob %s" % g.b64(v.encode()), g.b64(v.encode())[:-4]))
        out.append(("known:base64-userinfo", "Basic-ish %s" % g.b64(("user:" + v).encode()), g.b64(("user:" + v).encode())[8:-4]))
        out.append(("known:percent", "q=%s&x=1" % quote(v, safe=""), quote(v, safe="")))
        out.append(("known:json", json.dumps({"out": "v=" + v}), json.dumps(v)[1:-1]))
        out.append(("known:unicode", "v\\u003d" + "".join("\\u%04x" % ord(c) for c in v), "".join("\\u%04x" % ord(c) for c in v)))
    return out


def negatives(seed=21):
    """[(kind, text)]: ordinary output that must come back byte for byte."""
    g = Gen(seed)
    s, sha, uuid, ver = g.s, g.sha, g.uuid, g.version
    out = []
    add = lambda kind, text: out.append((kind, text))
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(g.rng.randrange(256) for _ in range(60))).decode()
    proto = base64.b64encode(b"\x0a\x05hello\x12\x03abc" + bytes(g.rng.randrange(256) for _ in range(30))).decode()
    for i in range(12):
        w = g.word()
        # git
        add("git:log", "commit %s\nAuthor: Dev One <dev@example.com>\nDate:   Tue May %d 10:%02d:11 2024 +0000\n\n    fix %s key lookup in %s (#%d)" % (sha(), g.num(1, 28), g.num(0, 59), w, g.word(), g.num(10, 9999)))
        add("git:push", "To github.com:org/%s.git\n   %s..%s  main -> main" % (w, sha(7), sha(7)))
        add("git:status", "On branch feature/%s-token-refresh\nChanges not staged for commit:\n\tmodified:   src/auth/%s_secret_store.py" % (w, g.word()))
        add("git:diff", "diff --git a/src/%s.py b/src/%s.py\nindex %s..%s 100644\n@@ -%d,3 +%d,4 @@\n-    token = get_token()\n+    token = get_token(refresh=True)\n+    api_key = settings.api_key" % (w, w, sha(7), sha(7), g.num(1, 99), g.num(1, 99)))
        add("git:clone", "Cloning into '%s'...\nremote: Enumerating objects: %d, done.\nReceiving objects: 100%% (%d/%d), %d.%02d MiB | %d.%02d MiB/s, done." % (w, g.num(100, 9999), g.num(100, 999), g.num(100, 999), g.num(1, 99), g.num(0, 99), g.num(1, 9), g.num(0, 99)))
        add("git:fetch-url", "From https://github.com/org/%s\n * branch            %s -> FETCH_HEAD" % (w, "main"))
        # pytest
        add("pytest:pass", "tests/test_%s.py::test_%s_token_refresh PASSED                [ %d%%]" % (w, g.word(), g.num(1, 99)))
        add("pytest:fail", "FAILED tests/test_auth.py::test_password_reset - AssertionError: assert 'expired' == 'valid'")
        add("pytest:summary", "==== %d passed, %d skipped, %d warnings in %d.%02ds ====" % (g.num(1, 900), g.num(0, 9), g.num(0, 9), g.num(1, 99), g.num(0, 99)))
        add("pytest:trace", "    def test_login(client):\n>       assert client.post('/login', data={'password': password}).status_code == 200\nE       assert 401 == 200")
        # npm / pip / cargo / go
        add("npm:install", "added %d packages, and audited %d packages in %ds\n\n%d packages are looking for funding" % (g.num(1, 900), g.num(1, 900), g.num(1, 60), g.num(1, 200)))
        add("npm:lock", '"node_modules/%s": {\n  "version": "%s",\n  "resolved": "https://registry.npmjs.org/%s/-/%s-%s.tgz",\n  "integrity": "sha512-%s=="\n}' % (w, ver(), w, w, ver(), s(86, B64)))
        add("npm:warn", "npm warn deprecated %s@%s: Use the token-based API instead" % (w, ver()))
        add("pip:install", "Collecting %s==%s\n  Downloading %s-%s-py3-none-any.whl (%d kB)\nSuccessfully installed %s-%s" % (w, ver(), w, ver(), g.num(10, 900), w, ver()))
        add("pip:hash", "%s==%s \\\n    --hash=sha256:%s" % (w, ver(), sha(64)))
        add("cargo:build", "   Compiling %s v%s\n   Compiling secret-service v%s\n    Finished `release` profile [optimized] target(s) in %d.%02ds" % (w, ver(), ver(), g.num(1, 99), g.num(0, 99)))
        add("go:test", "ok  \tgithub.com/org/%s/internal/tokenstore\t%d.%03ds\tcoverage: %d.%d%% of statements" % (w, g.num(0, 9), g.num(0, 999), g.num(1, 99), g.num(0, 9)))
        add("go:sum", "github.com/%s/%s v%s h1:%s=" % (w, g.word(), ver(), s(43, B64)))
        # docker / kubectl / terraform
        add("docker:build", "#%d [%d/%d] RUN --mount=type=secret,id=npm_token npm ci\n#%d DONE %d.%ds" % (g.num(1, 20), g.num(1, 9), g.num(10, 19), g.num(1, 20), g.num(0, 99), g.num(0, 9)))
        add("docker:pull", "%s: Pulling from library/%s\nDigest: sha256:%s\nStatus: Downloaded newer image for %s:%s" % (ver(), w, sha(64), w, ver()))
        add("docker:ps", "%s   %s:%s   \"/entrypoint.sh\"   %d minutes ago   Up %d minutes   0.0.0.0:%d->80/tcp   %s-%d" % (sha(12), w, ver(), g.num(1, 59), g.num(1, 59), g.num(1024, 65000), w, g.num(1, 9)))
        add("kubectl:get-secrets", "NAME                  TYPE                                  DATA   AGE\n%s-tls   kubernetes.io/tls   2      %dd\ndefault-token-%s   kubernetes.io/service-account-token   3   %dd" % (w, g.num(1, 99), s(5, LOWER), g.num(1, 99)))
        add("kubectl:describe", "Name:         %s-%s-%s\nNamespace:    prod\nSecretName:   %s-secret\nImage:        ghcr.io/org/%s@sha256:%s" % (w, s(10, LOWER), s(5, LOWER), w, w, sha(64)))
        add("kubectl:apply", "secret/%s-credentials configured\ndeployment.apps/%s unchanged" % (w, w))
        add("terraform:plan", "  # aws_secretsmanager_secret.%s will be created\n  + resource \"aws_secretsmanager_secret\" \"%s\" {\n      + arn  = (known after apply)\n      + name = \"prod/%s/db-password\"\n    }" % (w, w, w))
        add("terraform:sensitive", '      + password = (sensitive value)\n      + token    = (sensitive value)')
        add("terraform:arn", "aws_secretsmanager_secret_version.%s: Creation complete after 1s [id=arn:aws:secretsmanager:us-east-1:%d:secret:prod/%s-secret-%s]" % (w, g.num(10**11, 10**12 - 1), w, s(6)))
        # CI runners
        add("ci:github-actions", "Run actions/checkout@v4\n  with:\n    repository: org/%s\n    token: ***\n    ssh-strict: true" % w)
        add("ci:masked", "  GITHUB_TOKEN: ***\n  NPM_TOKEN: ***\n  password: ********")
        add("ci:secrets-ref", "  env:\n    API_KEY: ${{ secrets.API_KEY }}\n    DB_PASSWORD: ${{ secrets.DB_PASSWORD }}")
        add("ci:gitlab", "Running with gitlab-runner %s (%s)\n  on runner-%s %s, system ID: s_%s" % (ver(), sha(8), s(8, LOWER), s(8, LOWER), sha(12)))
        add("ci:buildkite", "~~~ Running global environment hook\n$ /buildkite/hooks/environment\n# BUILDKITE_AGENT_ACCESS_TOKEN redacted\nbuild id %s" % uuid())
        add("ci:placeholder", "export API_TOKEN=${API_TOKEN}\nexport DB_PASSWORD=$DB_PASSWORD\nset PASSWORD=%%PASSWORD%%\npassword: {{ .Values.db.password }}")
        add("ci:templates", "api_key: <your-api-key>\ntoken: your-token-here\nsecret: xxxxxxxxxxxx\npassword: ••••••••")
        add("ci:redacted", "token=[REDACTED] secret=<redacted> key=**** %s****%s sk-...%s" % (P["gho"], s(4), s(4)))
        # MCP traffic
        add("mcp:request", '{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"search","arguments":{"query":"how to rotate a token","max_tokens":%d}}}' % (g.num(1, 999), g.num(100, 4096)))
        add("mcp:response", '{"jsonrpc":"2.0","id":%d,"result":{"content":[{"type":"text","text":"Found %d files referencing secret_name"}],"isError":false}}' % (g.num(1, 999), g.num(1, 99)))
        add("mcp:init", '{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"claude-code","version":"%s"}}}' % ver())
        add("mcp:progress", '{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"%s","progress":%d,"total":100}}' % (uuid(), g.num(1, 99)))
        # ids and traps
        add("ids:uuid-sha", "request_id=%s trace=%s build=%d commit=%s" % (uuid(), sha(32), g.num(10**6, 10**9), sha()))
        add("ids:checksum", "%s  dist/%s-%s.tar.gz\nsha1: %s  md5: %s" % (sha(64), w, ver(), sha(40), sha(32)))
        add("ids:aws-words", "ASIAPACIFICSOUTHEAST region group; AKIAISADEPRECATEDWORD; TODAYINASIAASACKOFRICE")
        add("ids:arn", "arn:aws:secretsmanager:eu-west-1:%d:secret:app/%s/api-key-%s" % (g.num(10**11, 10**12 - 1), w, s(6)))
        add("ids:secret-name", "secret_name: prod/%s/db\nsecretName: %s-secret\nkey_id: %s\ntoken_type: Bearer\nmax_tokens: %d" % (w, w, uuid(), g.num(1, 9000)))
        add("ids:base64-image", "data:image/png;base64,%s" % png)
        add("ids:protobuf", "grpc-status-details-bin: %s" % proto)
        add("ids:identifier", "at com.example.%s.TokenRefreshingAuthenticationProviderFactoryBean.getObject(TokenRefreshingAuthenticationProviderFactoryBean.java:%d)" % (w, g.num(1, 999)))
        add("ids:minified", "function(e,t){var n=e.apiKey||t.token;return n?{Authorization:\"Bearer \"+n}:{}}var o=%s(e.key,t.secret);" % s(8, string.ascii_letters))
        add("ids:version", "%s version %s (build %s, %s)" % (w, ver(), sha(7), "go1.22.%d linux/amd64" % g.num(0, 9)))
        add("ids:prose", "The Authorization header carries a Bearer token; rotate the secret key and the password every %d days." % g.num(30, 90))
        add("ids:code", "    password = os.environ[\"DB_PASSWORD\"]\n    token = self._token\n    api_key: str = Field(default=None)\n    secret = get_secret(\"%s\")" % w)
        add("ids:lone-after-ordinary", "$ git rev-parse HEAD\n%s\n$ node --version\nv%s" % (sha(), ver()))
        add("ids:lone-after-base64", "$ echo aGVsbG8gd29ybGQ= | base64 -d\nhello world")
        add("ids:aws-config", "$ aws configure get region\nus-east-%d" % g.num(1, 2))
        add("ids:ssh", "ssh://git@github.com:22/org/%s.git and git@github.com:org/%s.git" % (w, w))
        add("ids:urls", "https://github.com/org/%s/blob/main/README.md?plain=1#L%d and http://localhost:%d/api" % (w, g.num(1, 99), g.num(1024, 9999)))
        add("ids:pubkey", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI%s dev@laptop" % s(43, B64))
        add("cli:ordinary", "npm config set registry https://registry.npmjs.org/\ngit config --global user.name Bob\n"
            "docker login -u ci --password-stdin < pw.txt\nmysql -h db -P 3306 -u root -p %s\n"
            "docker run -u 1000:1000 -p 8080:80 %s:%s\ncurl -u ci https://x" % (w, w, ver()))
        add("ci:actions-env", "##[group]Run actions/setup-node@v4\n  with:\n    node-version: 20\n  env:\n"
            "    NODE_AUTH_TOKEN: XXXXX-XXXXX-XXXXX-XXXXX\n##[endgroup]")
        add("pip:masked-index", "Looking in indexes: https://pypi.org/simple, https://****@pkgs.example.com/simple")
        add("kubectl:warning", "Warning: resource secrets/%s-credentials is missing the "
            "kubectl.kubernetes.io/last-applied-configuration annotation" % w)
        add("pytest:keyerror", "E   KeyError: 'api_key'\nE   AttributeError: 'Settings' object has no attribute 'secret_token'")
        add("cargo:test", "test tests::token_refresh_works ... ok\ntest auth::password_hash_roundtrip ... ok\n"
            "test result: ok. %d passed; 0 failed" % g.num(1, 99))
        add("docker:build-arg", "#5 [build 2/6] ARG NPM_TOKEN\n#6 [build 3/6] RUN --mount=type=secret,id=npmrc npm ci")
        add("vault:policies", "Key                  Value\n---                  -----\ntoken_policies       [\"default\"]\n"
            "token_ttl            768h\ntoken_renewable      true")
        add("cfg:ordinary-keys", "auth_token_ttl: 3600\npassword_min_length: 12\nprimary_key: id\nsort_key: created_at\n"
            "secret_ref: db-%s\nkey_name: deploy-%s" % (w, w))
        add("cfg:llm", '{"tokenizer": "cl100k_base", "max_tokens": 1024, "apiKeyEnv": "OPENAI_API_KEY", '
            '"token_limit": %d}' % g.num(1000, 9000))
        add("ids:minified-js", "a.token=b.token||c;e.secret=f.secret;var p=t.password||\"\";return{apiKey:n.apiKey}")
        add("ids:aws-docs", "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
        add("ids:pgp-signature", "-----BEGIN PGP SIGNATURE-----\n\niQIzBAABCAAdFiEE%s\n-----END PGP SIGNATURE-----" % s(40, B64))
        add("ids:configmap-b64", "data:\n  settings.json: %s" % base64.b64encode(json.dumps({"theme": w, "retries": 3}).encode()).decode())
        add("log:config-words", "INFO [db] cache loaded config token import loaded %s in %dms\n"
            "the config key lookup failed; config password policy: strict" % (sha(8), g.num(1, 900)))
        add("code:libraries", "self.signature = signature\nhttp_session=http_session,\n"
            "ACCESS_KEY = 'aws_access_key_id'\nprivate_key: CertificateIssuerPrivateKeyTypes,\n"
            "self._session: Session | None = None\n\"identitystore-auth:ListSessions\",\n"
            "signature = \"hypothesis.database._EDMeta.__call__\"\nsig='ii->i', token = -1\n"
            "ExtendedKeyUsageOID.SERVER_AUTH: \"serverAuth\",\n\"input_token\": \"next_token\",\n"
            "<a href=\"manual.html#basicopts\">2.7.2. Basic Options</a>\n"
            "password used to unlock a certificate; expecting the \"password:\" prompt")
        add("ids:prose-2", "Using secret key from the environment; rotate your API key and token regularly. Password policy: 12+ chars.")
        add("ids:cert", "-----BEGIN CERTIFICATE-----\nMIIB%s\n-----END CERTIFICATE-----" % s(60, B64))
    return out


def ordinary_log(size):
    """A realistic mixed log: app logs, HTTP access lines, test output, a git diff, JSON
    events, stack traces. Secret-adjacent words appear (token counts, cache keys, the word
    Authorization) but no secrets. ~2 MB of varied lines, repeated up to `size` bytes."""
    rng = random.Random(3)
    hexs = lambda n: "".join(rng.choice("0123456789abcdef") for _ in range(n))
    words = ("request handled user session cache miss retry queue worker build step test "
             "passed failed module import compile link deploy risk-assessment task-manager "
             "disk-usage config loaded reading writing token count key lookup").split()
    templates = [
        lambda: "2024-05-%02dT%02d:%02d:%02d.%03dZ INFO  [%s] %s %s in %dms" % (
            rng.randint(1, 28), rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59),
            rng.randint(0, 999), rng.choice(["api", "worker", "db", "auth"]),
            " ".join(rng.choice(words) for _ in range(6)), hexs(8), rng.randint(1, 900)),
        lambda: '10.0.%d.%d - - [01/May/2024:12:%02d:%02d +0000] "GET /api/v1/items/%d?page=%d HTTP/1.1" %d %d "-" "Mozilla/5.0"' % (
            rng.randint(0, 255), rng.randint(0, 255), rng.randint(0, 59), rng.randint(0, 59),
            rng.randint(1, 99999), rng.randint(1, 9), rng.choice([200, 201, 304, 404, 500]), rng.randint(100, 99999)),
        lambda: "tests/test_%s.py::test_%s_%d PASSED [%3d%%]" % (
            rng.choice(words), rng.choice(words), rng.randint(1, 99), rng.randint(0, 100)),
        lambda: "commit %s%s\nAuthor: Dev <dev@example.com>\n\n    fix %s in %s" % (
            hexs(20), hexs(20), rng.choice(words), rng.choice(words)),
        lambda: "diff --git a/src/%s.py b/src/%s.py\n@@ -%d,6 +%d,7 @@\n-    value = compute(%s)\n+    value = compute(%s, cache_key=key)" % (
            rng.choice(words), rng.choice(words), rng.randint(1, 500), rng.randint(1, 500),
            rng.choice(words), rng.choice(words)),
        lambda: '{"event":"llm_call","request_id":"%s-%s-%s","max_tokens":4096,"prompt_tokens":%d,"token_type":"bearer","status":"ok"}' % (
            hexs(8), hexs(4), hexs(12), rng.randint(1, 9000)),
        lambda: 'Traceback (most recent call last):\n  File "/usr/lib/python3.11/%s.py", line %d, in %s\nKeyError: \'%s\'' % (
            rng.choice(words), rng.randint(1, 900), rng.choice(words), rng.choice(words)),
        lambda: "WARN Authorization header missing for /health; see https://docs.example.com/auth#%s" % rng.choice(words),
    ]
    lines, total = [], 0
    while total < 2_000_000:
        line = rng.choice(templates)()
        lines.append(line)
        total += len(line) + 1
    block = "\n".join(lines) + "\n"
    return (block * (size // len(block) + 1))[:size]


def leaks(secret, text, out):
    """True if `out` (the redaction of `text`) still holds `secret`, or its first or last
    few characters where `text` had them only as part of the secret (a value cut short)."""
    if secret in out:
        return True
    k = max(4, min(8, len(secret) // 3))
    rest = text.replace(secret, "\0")
    for piece in (secret[:k], secret[-k:]):
        if out.count(piece) > rest.count(piece):
            return True
    return False
