"""Redaction: every listed format goes, ordinary text stays byte-for-byte, env values in
their encoded forms, config patterns, linear time on adversarial input.

Fine-grained vectors call the kernel directly (bridge.py imported by path); the `redact`
command is tested through the CLI with real stdin/stdout. Fake secrets are assembled at run
time so this file itself holds no token-shaped strings.
"""
import base64
import json
import random
import string
import subprocess
from urllib.parse import quote, quote_plus

import pytest

from conftest import BRIDGE, PYTHON, clean_env, load_bridge, run_bridge
import redaction_corpus

bridge = load_bridge()

R = bridge.REDACTED
_rng = random.Random(7)
ALNUM = string.ascii_letters + string.digits


def rnd(n, alphabet=ALNUM):
    """A random string that has a digit, an upper- and a lower-case letter (secret-like)."""
    while True:
        s = "".join(_rng.choice(alphabet) for _ in range(n))
        if n < 3 or alphabet != ALNUM or (any(c.isdigit() for c in s) and s.lower() != s != s.upper()):
            return s


HEX = "0123456789abcdef"
B64 = ALNUM + "+/"
URLSAFE = ALNUM + "-_"


def redactor(env=None, patterns=()):
    return bridge.Redactor(patterns, env={} if env is None else env)


# ---- every format ---------------------------------------------------------------

def _formats():
    """(name, text, secret): `secret` must be gone from redact(text)."""
    pem_body = "\n".join(rnd(64, B64) for _ in range(5))
    jwt = "eyJ" + rnd(30, URLSAFE) + ".eyJ" + rnd(60, URLSAFE) + "." + rnd(43, URLSAFE)
    azure_key = rnd(86, B64) + "=="
    v = []
    add = lambda name, text, secret: v.append(pytest.param(text, secret, id=name))
    for p in ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"):
        t = p + rnd(36)
        add("github-" + p, "remote: using %s for auth" % t, t)
    t = "github_pat_" + rnd(22) + "_" + rnd(59)
    add("github-fine-grained", "GH=%s" % t, t)
    t = "glpat-" + rnd(20, URLSAFE)
    add("gitlab-pat", "token %s expired" % t, t)
    t = "xoxb-" + rnd(12, string.digits) + "-" + rnd(13, string.digits) + "-" + rnd(24)
    add("slack-bot", "slack: %s" % t, t)
    t = "xoxp-" + "-".join(rnd(12, string.digits) for _ in range(3)) + "-" + rnd(32, HEX)
    add("slack-user", "(%s)" % t, t)
    t = "T" + rnd(8, string.ascii_uppercase) + "/B" + rnd(8, string.ascii_uppercase) + "/" + rnd(24)
    add("slack-webhook", "POST https://hooks.slack.com/services/%s ok" % t, t)
    t = "M" + rnd(23) + "." + rnd(6, URLSAFE) + "." + rnd(27, URLSAFE)
    add("discord-bot", "Discord client login with %s" % t, t)
    t = rnd(18, string.digits) + "/" + rnd(68, URLSAFE)
    add("discord-webhook", "https://discord.com/api/webhooks/%s" % t, t)
    t = rnd(10, string.digits) + ":AA" + rnd(33, URLSAFE)
    add("telegram-bot", "https://api.telegram.org/bot%s/getMe" % t, t)
    t = rnd(10, string.digits) + ":AA" + rnd(33, URLSAFE)
    add("telegram-bot-bare", "bot %s started" % t, t)
    for p in ("sk_live_", "sk_test_", "rk_live_", "rk_test_"):
        t = p + "51" + rnd(97)
        add("stripe-" + p, "stripe.api_key = '%s'" % t, t[8:])
    t = "whsec_" + rnd(32)
    add("stripe-webhook", "signing with %s" % t, t)
    t = "sk-" + rnd(48)
    add("openai-legacy", "OPENAI: %s" % t, t)
    t = "sk-proj-" + rnd(74, URLSAFE) + "T3BlbkFJ" + rnd(74, URLSAFE)
    add("openai-project", "key=%s" % t, t)
    t = "sk-svcacct-" + rnd(58, URLSAFE) + "T3BlbkFJ" + rnd(58, URLSAFE)
    add("openai-service-account", "using %s" % t, t)
    t = "sk-ant-api03-" + rnd(93, URLSAFE) + "AA"
    add("anthropic-api", "x %s y" % t, t)
    t = "sk-ant-admin01-" + rnd(93, URLSAFE) + "AA"
    add("anthropic-admin", "'%s'" % t, t)
    t = "sk-ant-oat01-" + rnd(80, URLSAFE)
    add("anthropic-oauth", "CLAUDE_CODE_OAUTH_TOKEN %s" % t, t)
    t = "sk-or-v1-" + rnd(64, HEX)
    add("openrouter", "%s" % t, t)
    t = "gsk_" + rnd(52)
    add("groq", "groq %s" % t, t)
    t = "xai-" + rnd(80)
    add("xai", "xai %s" % t, t)
    t = "r8_" + rnd(37)
    add("replicate", "r8 %s" % t, t)
    t = "hf_" + rnd(34)
    add("huggingface", "login %s" % t, t)
    t = "pplx-" + rnd(48)
    add("perplexity", "pplx %s" % t, t)
    t = "npm_" + rnd(36)
    add("npm", "//registry.npmjs.org/:_authToken=%s" % t, t)
    t = "pypi-AgEIcHlwaS5vcmc" + rnd(70, URLSAFE)
    add("pypi", "password = %s" % t, t)
    t = "dckr_pat_" + rnd(27, URLSAFE)
    add("docker-hub", "docker login -p %s" % t, t)
    t = "AKIA" + rnd(16, string.ascii_uppercase + "234567")
    add("aws-access-key-id", "aws_access_key_id=%s" % t, t)
    t = "ASIA" + rnd(16, string.ascii_uppercase + "234567")
    add("aws-sts-key-id", "[%s]" % t, t)
    t = rnd(40, B64)
    add("aws-secret-in-context", "aws_secret_access_key = %s" % t, t)
    add("aws-secret-json", '{"AccessKeyId": "x", "SecretAccessKey": "%s"}' % t, t)
    t = rnd(300, B64)
    add("aws-session-token-json", '"SessionToken": "%s",' % t, t)
    t = "AIza" + rnd(35, URLSAFE)
    add("gcp-api-key", "https://maps.googleapis.com/x?key=%s&v=3" % t, t)
    add("azure-storage-conn",
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=%s;EndpointSuffix=core.windows.net"
        % azure_key, azure_key)
    t = rnd(43, B64) + "="
    add("azure-servicebus-conn",
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=%s" % t, t)
    t = rnd(3) + "8Q~" + rnd(34, URLSAFE + "~.")
    add("azure-ad-client-secret", "secret value %s ." % t, t)
    for kind in ("RSA ", "EC ", "OPENSSH ", "ENCRYPTED ", ""):
        block = "-----BEGIN %sPRIVATE KEY-----\n%s\n-----END %sPRIVATE KEY-----" % (kind, pem_body, kind)
        add("pem-" + (kind.strip() or "pkcs8"), "key:\n%s\ndone" % block, pem_body.split("\n")[2])
    block = "-----BEGIN PGP PRIVATE KEY BLOCK-----\nVersion: x\n\n%s\n-----END PGP PRIVATE KEY BLOCK-----" % pem_body
    add("pem-pgp", block, pem_body.split("\n")[3])
    add("pem-json-escaped", json.dumps({"private_key": "-----BEGIN PRIVATE KEY-----\n%s\n-----END PRIVATE KEY-----\n" % pem_body}),
        pem_body.split("\n")[1])
    add("pem-unterminated", "-----BEGIN RSA PRIVATE KEY-----\n%s\n" % pem_body, pem_body.split("\n")[4])
    add("pem-legacy-encrypted-unterminated",
        "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,%s\n\n%s"
        % (rnd(32, HEX.upper()), pem_body), pem_body.split("\n")[0])
    add("jwt", "id_token %s end" % jwt, jwt.split(".")[1])
    add("jwt-signature", "Cookie-less %s" % jwt, jwt.split(".")[2])
    pw = rnd(14)
    add("url-password", "DATABASE_URL=postgres://app:%s@db.internal:5432/app" % pw, pw)
    add("url-password-srv", "mongodb+srv://admin:%s@cluster0.x.mongodb.net/?retryWrites=true" % pw, pw)
    add("url-password-no-user", "redis://:%s@cache:6379/0" % pw, pw)
    t = "ghs_" + rnd(36)
    add("url-git-token", "git clone https://x-access-token:%s@github.com/o/r.git" % t, t)
    add("conn-string-password", "Server=tcp:db,1433;Database=app;User Id=sa;Password=%s;" % pw, pw)
    add("conn-string-pwd", "Driver={ODBC};Uid=sa;Pwd=%s;" % pw, pw)
    add("jdbc-password", "jdbc:postgresql://db/app?user=app&password=%s&ssl=true" % pw, pw)
    tok = rnd(40, URLSAFE + ".~+/")
    for text in ("Authorization: Bearer %s", "authorization: bearer %s", "AUTHORIZATION:Bearer %s",
                 "-H 'Authorization: Bearer %s'", '{"Authorization": "Bearer %s"}',
                 "Proxy-Authorization: Bearer %s", "Authorization: Token %s", "Authorization=%s",
                 "auth header Bearer %s", "X-Api-Key: %s", "x-api-key: %s", 'X-API-KEY=%s',
                 '"x-api-key": "%s"', "api_key=%s", "apiKey: %s", "API-KEY: %s",
                 "ANTHROPIC_API_KEY=%s", "anthropic-api-key = %s", "OPENAI_KEY=%s",
                 "client_secret=%s", "secret: %s", "token: %s", "access_token=%s",
                 "refresh_token: '%s'", "GITHUB_TOKEN=%s", "X-Auth-Token: %s", "Cookie: sid=%s",
                 "private_key = \"%s\"", "db_password := \"%s\"", "passwd => '%s'",
                 "--password %s", "--token=%s", "--api-key %s", '{\\"password\\": \\"%s\\"}',
                 "sig=%s", "credentials: %s"):
        add("kv:" + text.split("%")[0].strip()[:24], text % tok, tok)
    basic = base64.b64encode(("alice:" + pw).encode()).decode()
    for text in ("Authorization: Basic %s", "authorization: basic %s", "Proxy-Authorization: Basic %s",
                 "curl -H 'Authorization: Basic %s'", "sent Basic %s to the proxy"):
        add("basic:" + text[:20], text % basic, basic)
    for text in ("password=%s", "PASSWORD: %s", "Password = '%s'", '"password": "%s"',
                 "db_passwd=%s", "passphrase: %s", "MYSQL_PWD=%s"):
        add("password:" + text[:10], text % "hunter2", "hunter2")
    return v


@pytest.mark.parametrize("text,secret", _formats())
def test_every_format_is_redacted(text, secret):
    out = redactor().redact(text)
    assert secret not in out, out
    assert R in out
    assert redactor().redact(out) == out          # idempotent


@pytest.mark.parametrize("text,expected", [
    ('"token": "${X} password=hunter2"', '"token": "${X} password=[REDACTED]"'),
    ("Authorization: Bearer abcDEF0123456789xyz", "Authorization: Bearer [REDACTED]"),
    ("Authorization: Basic YWxpY2U6czNjcjN0", "Authorization: Basic [REDACTED]"),
    ('"x-api-key": "k3y-abcdef-123"', '"x-api-key": "[REDACTED]"'),
    ("password=hunter2 user=bob", "password=[REDACTED] user=bob"),
    ("PASSWORD: 'hunter2' # set", "PASSWORD: '[REDACTED]' # set"),
    ("https://bob:pa55word@example.com/x", "https://bob:[REDACTED]@example.com/x"),
    ("export OPENAI_API_KEY=sk-" + "a1" * 24, "export OPENAI_API_KEY=[REDACTED]"),
    ("risk-assessment sk-" + "Ab3" * 16 + " done", "risk-assessment [REDACTED] done"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----\nnext",
     "-----BEGIN RSA PRIVATE KEY-----[REDACTED]-----END RSA PRIVATE KEY-----\nnext"),
    ("https://hooks.slack.com/services/T0/B0/abcdefgh1234", "https://hooks.slack.com/services/[REDACTED]"),
    ("Cookie: theme=dark; sid=Zk29dLq81x\nnext", "Cookie: [REDACTED]\nnext"),
    ('-H "Set-Cookie: sid=Zk29dLq81x; Path=/; HttpOnly" -v', '-H "Set-Cookie: [REDACTED]" -v'),
])
def test_replacement_keeps_keys_and_schemes(text, expected):
    assert redactor().redact(text) == expected


@pytest.mark.parametrize("text,expected", [
    # values that contain pass/pwd/secret/token/key/auth are still secrets
    ("password=Passw0rd2024", "password=" + R), ("DB_PASSWORD=SuperSecret123", "DB_PASSWORD=" + R),
    ("client_secret=MySecretValue9", "client_secret=" + R), ("api_key=monkey9Xq2LmN7", "api_key=" + R),
    ("secret: keystone42Aa", "secret: " + R),
    # ... but a variable named like one is code
    ("token=access_token", "token=access_token"), ("password=password", "password=password"),
    # characters legal in passwords do not end the value; a query parameter after "&" does
    ("password=Tr0ub4dor&3xyz", "password=" + R), ("password=Tr0ub4dor#3xyz", "password=" + R),
    ("?user=bob&password=Tr0ub4dor3&next=/home", "?user=bob&password=%s&next=/home" % R),
    # URL userinfo runs to the last "@" before the host
    ("postgres://app:p@ss#w/rd?1@db.internal:5432/app", "postgres://app:%s@db.internal:5432/app" % R),
    ("https://host:8080/path/@scope/pkg", "https://host:8080/path/@scope/pkg"),
    ("a=https://u:Pw1xyz@h1/,b=https://v:Qw2xyz@h2/", "a=https://u:%s@h1/,b=https://v:%s@h2/" % (R, R)),
    # credentials given to commands
    ("curl -u admin:Zk29dLq81 https://x", "curl -u admin:%s https://x" % R),
    ("curl --user 'ci:Zk29 dLq81' https://x", "curl --user 'ci:%s' https://x" % R),
    ("docker login -u ci -p Zk29dLq81 ghcr.io", "docker login -u ci -p %s ghcr.io" % R),
    ("mysql -h db -P3306 -u root -pZk29dLq81 app", "mysql -h db -P3306 -u root -p%s app" % R),
    ("sshpass -p 'Zk29dLq81' ssh h", "sshpass -p '%s' ssh h" % R),
    ("htpasswd -bc .htpasswd admin Zk29dLq81", "htpasswd -bc .htpasswd admin " + R),
    ("openssl rsa -in k.pem -passin pass:Zk29dLq81 -out p", "openssl rsa -in k.pem -passin pass:%s -out p" % R),
    ("redis-cli -h cache -a Zk29dLq81 ping", "redis-cli -h cache -a %s ping" % R),
    ("machine api.example.com login ci password Zk29dLq81", "machine api.example.com login ci password " + R),
    ("docker run -u 1000:1000 -p 8080:80 img", "docker run -u 1000:1000 -p 8080:80 img"),
    # configuration formats
    ("<password>Zk29dLq81</password>", "<password>%s</password>" % R),
    ('<add key="ClearTextPassword" value="Zk29dLq81" />', '<add key="ClearTextPassword" value="%s" />' % R),
    ("Server=db;User ID=sa;Password=Zk29&dLq81;Encrypt=True", "Server=db;User ID=sa;Password=%s;Encrypt=True" % R),
    # escaped forms
    ("body=user%3Dbob%26password%3DZk29dLq81%26x%3D1", "body=user%3Dbob%26password%3D" + R + "%26x%3D1"),
    ('{"password\\u0022: \\u0022Zk29dLq81\\u0022}', '{"password\\u0022: \\u0022%s\\u0022}' % R),
    # a lone value printed by a command that prints a secret
    ("$ vault kv get -field=password secret/db\nZk29dLq81xWm\n$ ls", "$ vault kv get -field=password secret/db\n%s\n$ ls" % R),
    ("$ git rev-parse HEAD\n9fceb02d0ae598e95dc970b74767f19372d61af8\n", "$ git rev-parse HEAD\n9fceb02d0ae598e95dc970b74767f19372d61af8\n"),
    # curl's forms (gitleaks' examples): quoted halves, a key as the user, a continued line
    ("curl --user kevin:'pRf7vG2h1L8nQkW9' -iX PATCH", "curl --user kevin:'%s' -iX PATCH" % R),
    ('curl -u "d2LkV78zLx!t:" https://localhost:9200', 'curl -u "%s:" https://localhost:9200' % R),
    ("$ curl https://x/token \\\n  --user c28wlsosanujy2z:qgsnai0xokrw4j1 --data y",
     "$ curl https://x/token \\\n  --user c28wlsosanujy2z:%s --data y" % R),
    ("curl -i -u 'test:test' && curl -u <user:password> x && curl -u username:token",
     "curl -i -u 'test:test' && curl -u <user:password> x && curl -u username:token"),
    # a format's upper bound is not the end of the token; placeholders shaped like tokens
    ("k AIza" + "Tesb6Tscfcni8vIpWZqNCXFDFslJtVSvFDqabcd123 z", "k %s z" % R),
    ("ops_eyJ" + "x" * 260 + " AK" + "Cp" + "X" * 69, "ops_eyJ" + "x" * 260 + " AK" + "Cp" + "X" * 69),
    ("token: s.ZC9Ecf4M5g9o34Q6RkzGsj0z", "token: " + R),
    # already masked, placeholders, words shaped like tokens
    ("token: your-token-here, secret: xxxxxxxx, password: ••••••, key=[REDACTED]",
     "token: your-token-here, secret: xxxxxxxx, password: ••••••, key=[REDACTED]"),
    ("ASIAPACIFICSOUTHEAST arn:aws:secretsmanager:us-east-1:123456789012:secret:prod/db-secret-AbC123",
     "ASIAPACIFICSOUTHEAST arn:aws:secretsmanager:us-east-1:123456789012:secret:prod/db-secret-AbC123"),
])
def test_issue_vectors(text, expected):
    assert redactor().redact(text) == expected


def test_token_after_a_word_character_when_its_shape_says_so():
    t = "xo" + "xb-" + rnd(12, string.digits) + "-" + rnd(13, string.digits) + "-" + rnd(24)
    assert redactor().redact("notes_" + t + " end") == "notes_%s end" % R
    assert redactor().redact("risk-assessment task-definitions flask-sqlalchemy") == \
        "risk-assessment task-definitions flask-sqlalchemy"


# ---- the corpus: recall and false positives, measured ---------------------------------

KNOWN = ("Zq9-" + "kL2mN8pR4tV6", 'p@ss/w"rd+Zq9 7&x')


def corpus_scores(redact):
    """(recall, false-positive rate, misses, false positives) of `redact` on the corpus."""
    pos = redaction_corpus.positives() + redaction_corpus.config_secret_positives(KNOWN)
    neg = redaction_corpus.negatives()
    misses = [(kind, text) for kind, text, secret in pos
              if redaction_corpus.leaks(secret, text, redact(text))]
    changed = [(kind, text) for kind, text in neg if redact(text) != text]
    return 1 - len(misses) / len(pos), len(changed) / len(neg), misses, changed


def test_corpus_recall_and_false_positives():
    pos = redaction_corpus.positives()
    assert len(pos) >= 400 and len({kind for kind, _, _ in pos}) >= 80
    assert len(redaction_corpus.negatives()) >= 400
    r = bridge.Redactor((), env={}, known=KNOWN)
    recall, fp_rate, misses, changed = corpus_scores(r.redact)
    assert recall >= 0.99, misses[:20]
    assert fp_rate <= 0.01, changed[:20]


# ---- false positives ----------------------------------------------------------------

def test_the_benchmark_log_is_unchanged():
    text = redaction_corpus.ordinary_log(2_000_000)    # what `make bench` times, 50 MB of it
    assert redactor().redact(text) == text


CORPUS = r'''2024-05-01T12:00:03.123Z INFO  server listening on http://127.0.0.1:8080/ (pid 4242)
2024-05-01T12:00:04Z WARN  disk-usage at 91% on /var/lib/docker; risk-assessment job queued
2024-05-01T12:00:05Z DEBUG task-manager picked task-definitions/web:42 for kiosk-deployment
ERROR Authorization header missing; Authorization failed for user bob (authorization_pending)
Bearer tokens are described in RFC 6750. The client parses Bearer header values.
WWW-Authenticate: Bearer realm="api", error="invalid_token"
Authorization: Bearer ${API_TOKEN}
Authorization: Bearer <YOUR_TOKEN>
curl -H "Authorization: Bearer $TOKEN" -H 'x-api-key: ${{ secrets.API_KEY }}' https://api.example.com
password: ********   token: [REDACTED]   secret: <none>
Basic usage: run `make test`. Basic auth is disabled.
request id 3f2b8c1e-9d4a-4c7b-8e2f-1a2b3c4d5e6f commit 9fceb02d0ae598e95dc970b74767f19372d61af8
Merge: 1a2b3c4 5d6e7f8   tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904
integrity sha512-z4PhNX7vuL3xVChQ1m2AB9Yg5AULVxXcg/SpIdNs6c5H0NE8XYXysP+DGNKHfuwvY7kxvUdBeoGlODJ6+SfaPg==
data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==
max_tokens: 4096, prompt_tokens=12, "token_type": "bearer", "token_count": 17, tokenizer=cl100k
TOKENIZERS_PARALLELISM=false KEYBOARD_LAYOUT=us public_key: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5 u@h
primary_key = "id"; sort_key: created_at; key_id=abc; secret_name=prod/db; password_file=/run/pw
email bob@example.com, ssh://git@github.com:22/org/repo.git, git@github.com:org/repo.git
https://github.com/org/repo/blob/main/README.md?plain=1#L10 and http://localhost:3000/api
The monkey pressed a key; the token ring is a keyboard secret-free zone. Pass the salt.
sk-learn, flask-sqlalchemy, disk-utilization, ask-me-anything, mask-rcnn, task-1234567890abcdefghij
TODAYINASIAASACKOFRICEFELLOVER; AKIA is a prefix; AIza is a prefix; ghp_ too; eyJ alone.
-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEexample
-----END PUBLIC KEY-----
-----BEGIN CERTIFICATE-----
MIIBszCCAVmgAwIBAgIUexample
-----END CERTIFICATE-----
'''

CODE = r'''diff --git a/app/auth.py b/app/auth.py
index 1a2b3c4..5d6e7f8 100644
--- a/app/auth.py
+++ b/app/auth.py
@@ -1,12 +1,14 @@
 import os
-def login(user, password: str, token: Optional[str] = None) -> bool:
+def login(user, password: str, api_key: SecretStr, token=None) -> bool:
     password = getpass.getpass()
     token = os.environ["GITHUB_TOKEN"]
+    api_key = args.api_key
+    secret = self.secret
     headers = {"Authorization": "Bearer " + token, "X-Api-Key": api_key}
+    session.auth = (user, password)
     if not password:
         raise ValueError("password required")
     key = cache_key(user)
     return check(token=token, password=password)
 const apiKey = process.env.API_KEY;
 let token: string;
 password_hash = bcrypt(password)
 for key, value in items.items():
     print(f"{key}={value}")
'''


def test_ordinary_text_is_unchanged_byte_for_byte():
    r = redactor(env={"HOME": "/home/bob", "PATH": "/usr/bin:/bin"})
    for text in (CORPUS, CODE):
        out = r.redact(text)
        assert out == text, "\n".join(
            "-%s\n+%s" % (a, b) for a, b in zip(text.splitlines(), out.splitlines()) if a != b)


def test_ordinary_text_unchanged_through_the_cli():
    data = (CORPUS + CODE).encode() + b"latin-1 bytes \xe9\xff and UTF-8 \xc3\xa9 \xf0\x9f\x94\x91\n"
    proc = subprocess.run([PYTHON, str(BRIDGE), "redact"], input=data, capture_output=True,
                          env=clean_env(TOKENIZERS_PARALLELISM="false", SHORT_TOKEN="abc12",
                                        SSH_KEY_PATH="/home/bob/.ssh/id_ed25519", GIT_AUTHOR_NAME="Bob Smith"),
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == data


# ---- environment values ---------------------------------------------------------------

SECRET_VALUE = 'p@ss/w"rd+Zq9 7&x'


def test_env_values_redacted_in_every_form_through_the_cli(tmp_path):
    v = SECRET_VALUE
    forms = {
        "raw": v,
        "base64": base64.b64encode(v.encode()).decode(),
        "base64-userinfo": base64.b64encode(("deploy:" + v).encode()).decode(),
        "base64-userinfo2": base64.b64encode(("ab:" + v).encode()).decode(),
        "url": quote(v, safe=""),
        "url-plus": quote_plus(v),
        "json": json.dumps(v)[1:-1],
    }
    text = "".join("%s: <%s> end\n" % item for item in forms.items())
    env = clean_env(DEPLOY_SECRET=v, MY_API_TOKEN="Zk29dLq81xWm", DB_PASSWORD="Tr0ub4dor&3xx",
                    TOKENIZERS_PARALLELISM="false", GITHUB_TOKEN="1", AUTH_MODE="default",
                    SIGNING_KEY_PATH="/etc/keys/signing.pem")
    text += "tok Zk29dLq81xWm pw Tr0ub4dor&3xx mode default parallelism false path /etc/keys/signing.pem 61.0\n"
    proc = run_bridge("redact", "--root", tmp_path, input=text, env=env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for name, form in forms.items():
        assert form not in out, name
    core = base64.b64encode(v.encode()).decode()[4:-4]
    assert core not in out
    assert "Zk29dLq81xWm" not in out and "Tr0ub4dor" not in out
    assert "mode default parallelism false path /etc/keys/signing.pem 61.0" in out
    assert out.count(R) >= len(forms) + 2
    for name in forms:
        assert "%s: <" % name in out          # only the value went


def test_env_name_and_value_rules():
    r = redactor(env={"SERVICE_TOKEN": "line-one-secret\nline-two-secret", "MAX_TOKENS": "40960000",
                      "KEY_FILE": "/tmp/key.pem.backup", "WEBHOOK_URL": "https://example.com/h",
                      "GPG_KEY": "A035C8C19219BA821ECEA86B64E628F8D684696D", "APP_SECRET": "production",
                      "OLDPWD": "/home/bob/src/project"})
    text = "a line-two-secret b 40960000 /tmp/key.pem.backup production A035C8C19219BA821ECEA86B64E628F8D684696D"
    assert r.redact(text) == "a %s b 40960000 /tmp/key.pem.backup production A035C8C19219BA821ECEA86B64E628F8D684696D" % R


# ---- config patterns --------------------------------------------------------------------

def test_config_patterns_through_cli_with_root_and_config(tmp_path):
    (tmp_path / "bridge.config.json").write_text(json.dumps({"redaction_patterns": [r"ACME-\d{6}"]}))
    proc = run_bridge("redact", "--root", tmp_path, input="order ACME-123456 shipped\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "order %s shipped\n" % R
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"redaction_patterns": [r"internal-host-\w+", r"(?i)project\s+zeus"]}))
    proc = run_bridge("redact", "--root", tmp_path, "--config", other,
                      input="ping internal-host-db1 for Project  Zeus; ACME-123456\n")
    assert proc.stdout == "ping %s for %s; ACME-123456\n" % (R, R)


def test_invalid_config_pattern_is_a_precise_error(tmp_path):
    cfg = tmp_path / "bad.json"
    cfg.write_text(json.dumps({"redaction_patterns": ["ok", "token=(["]}))
    proc = run_bridge("redact", "--root", tmp_path, "--config", cfg, input="x\n")
    assert proc.returncode == 2
    assert "redaction_patterns" in proc.stderr and "'token=(['" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    with pytest.raises(bridge.BridgeError) as err:
        bridge.get_redactor({"redaction_patterns": ["a{2,1}"]})
    assert "'a{2,1}'" in err.value.message


def test_get_redactor_is_cached_per_patterns():
    a = bridge.get_redactor({"redaction_patterns": ["zz\\d+"]})
    assert bridge.get_redactor({"redaction_patterns": ["zz\\d+"]}) is a
    assert bridge.get_redactor({}) is bridge.get_redactor(None) is not a
    assert a.redact("id zz42") == "id " + R


def test_redact_obj_is_deep_and_keeps_types():
    t = "ghp_" + rnd(36)
    obj = {"cmd": "git push https://u:%s@h/r" % t, "n": 3, "ok": True, "none": None,
           "nested": [{"out": "token=" + t}, ("x", t)], t: "key named by a token"}
    out = redactor().redact_obj(obj)
    assert t not in json.dumps(out)
    assert out["n"] == 3 and out["ok"] is True and out["none"] is None
    assert out["nested"][0]["out"] == "token=" + R and out["nested"][1] == ["x", R]


def test_redact_obj_redacts_values_of_secret_named_keys():
    obj = {"password": "hunter2", "headers": {"Authorization": "Bearer abc", "X-Api-Key": "k3y"},
           "apiKey": "plainvalue", "max_tokens": "4096", "token_type": "bearer", "key": "name",
           "secret": "${SECRET}", "token": "", "user": "bob", "auth": {"password": "pw1"}}
    out = redactor().redact_obj(obj)
    assert out == {"password": R, "headers": {"Authorization": "Bearer " + R, "X-Api-Key": R},
                   "apiKey": R, "max_tokens": "4096", "token_type": "bearer", "key": "name",
                   "secret": "${SECRET}", "token": "", "user": "bob", "auth": {"password": R}}


def test_bytes_are_redacted_and_undecodable_bytes_kept():
    t = ("ghp_" + rnd(36)).encode()
    assert redactor().redact(b"\xff\xfe token " + t + b" \xe9") == b"\xff\xfe token " + R.encode() + b" \xe9"
    with pytest.raises(TypeError):
        redactor().redact(42)


def test_bridge_own_tokens_are_secret_env_values():
    r = redactor(env={"BRIDGE_OBS_TOKEN": "obs-Tok3n-value-77"})
    assert r.redact("ws://h/?token=x obs-Tok3n-value-77") == "ws://h/?token=x " + R


def test_prose_after_a_colon_is_not_a_value():
    text = ("Password: Enter your password below\nToken: Provide a token\n"
            "Auth: token from `Authorization: Bearer <t>` header\n"
            "usage: tool --password VALUE --token TOKEN; git clone https://x-access-token:TOKEN@host/r\n")
    assert redactor().redact(text) == text
    assert redactor().redact("password: Hunter # yaml\n") == "password: %s # yaml\n" % R


# ---- secrets the config hands out -------------------------------------------------------

def test_config_env_values_are_redacted_in_every_form_through_the_cli(tmp_path):
    secrets = {"executor": "Ex3cut0r-Val-9q", "doctor": "D0ct0r.Val.7z", "mcp": "Mcp+Val/5w"}
    cfg = tmp_path / "bridge.config.json"
    cfg.write_text(json.dumps({
        "executor": {"command": ["agent"], "env": {"AGENT_API_KEY": secrets["executor"],
                                                    "AGENT_MODEL": "anthropic/claude-sonnet-4",
                                                    "AGENT_REGION": "eu-west-1"}},
        "doctor": {"env": {"X_OPAQUE": secrets["doctor"]}},
        "changes": {"mcp": {"env": {"MCP_PASSWORD": secrets["mcp"]}}}}))
    lines = []
    for v in secrets.values():
        lines += ["raw %s ." % v, "b64 %s ." % base64.b64encode(v.encode()).decode(),
                  "url %s ." % quote(v, safe=""), "json %s ." % json.dumps(v)[1:-1],
                  "u %s ." % "".join("\\u%04x" % ord(c) for c in v)]
    lines.append("model anthropic/claude-sonnet-4 in eu-west-1")
    proc = run_bridge("redact", "--root", tmp_path, input="\n".join(lines) + "\n")
    assert proc.returncode == 0, proc.stderr
    for v in secrets.values():
        assert v not in proc.stdout and base64.b64encode(v.encode()).decode()[:-4] not in proc.stdout
    assert proc.stdout.count(R) == 15
    assert "model anthropic/claude-sonnet-4 in eu-west-1" in proc.stdout


def test_config_secrets_lists_env_maps_and_secret_named_keys():
    config = {"executor": {"env": {"A_TOKEN": "short1", "OPAQUE": "Zk29dLq81xWm", "MODE": "production"}},
              "observability": {"token": "obs-Tok3n"}, "seam": {"command": "python3 x"}}
    assert sorted(bridge.config_secrets(config)) == ["Zk29dLq81xWm", "obs-Tok3n", "short1"]


# ---- the redact command as a stream -------------------------------------------------------

def test_stream_sees_a_secret_split_across_pieces():
    token = "gh" + "p_" + rnd(36)
    stream = redactor().stream()
    out = stream.feed("start\nuse " + token[:10]) + stream.feed(token[10:30]) + \
        stream.feed(token[30:] + " now\nnext ") + stream.close()
    assert out == "start\nuse %s now\nnext " % R
    stream = redactor().stream()        # bytes, and a lone secret after its command
    out = stream.feed(b"$ op read op://ci/db/password\n") + stream.feed(b"Zk29dLq81xWm\n") + stream.close()
    assert out == b"$ op read op://ci/db/password\n%s\n" % R.encode()


def test_cli_streams_and_keeps_private_key_blocks_whole_across_reads(tmp_path):
    body = "\n".join(rnd(64, B64) for _ in range(40))
    block = "-----BEGIN OPENSSH PRIVATE KEY-----\n%s\n-----END OPENSSH PRIVATE KEY-----\n" % body
    filler = ("INFO ordinary line %06d of the build log\n" * 40000) % tuple(range(40000))
    data = filler + block + filler + "tail without newline password=hunter2"
    proc = run_bridge("redact", "--root", tmp_path, input=data)
    assert proc.returncode == 0, proc.stderr
    expected = filler + "-----BEGIN OPENSSH PRIVATE KEY-----%s-----END OPENSSH PRIVATE KEY-----\n" % R \
        + filler + "tail without newline password=" + R
    assert proc.stdout == expected


def test_cli_flushes_each_read_for_live_pipelines(tmp_path):
    token = ("gh" + "p_" + rnd(36)).encode()
    proc = subprocess.Popen([PYTHON, str(BRIDGE), "redact", "--root", str(tmp_path)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=clean_env())
    try:
        proc.stdin.write(b"first password=hunter2\npush with " + token[:15])
        proc.stdin.flush()
        assert proc.stdout.readline() == b"first password=[REDACTED]\n"   # before EOF
        proc.stdin.write(token[15:] + b" done\nsecond line\n")      # a token split across writes
        proc.stdin.close()
        assert proc.stdout.read() == b"push with [REDACTED] done\nsecond line\n"
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


# ---- linear time ---------------------------------------------------------------------------

MB = 1 << 20


def adversarial_inputs():
    """1 MB each of the shapes that make backtracking regexes blow up (reference section 5)."""
    rep = lambda s: (s * (MB // len(s) + 1))[:MB]
    return {
        "authorization-headers-no-value": rep("Authorization: "),
        "x-api-key-headers": rep("x-api-key:"),
        "begin-flood": rep("-----BEGIN RSA PRIVATE KEY-----\n"),
        "begin-flood-no-newline": rep("-----BEGIN PRIVATE KEY-----"),
        "a-run": "a" * MB,
        "a-equals-run": rep("a="),
        "api-key-assignments": rep("api_key="),
        "key-dot-run": rep("key."),
        "eyJ-run": rep("eyJ"),
        "eyJ-dot-run": rep("eyJhbGciOiJIUzI1NiJ9."),
        "url-userinfo-run": "https://" + rep("a:"),
        "scheme-flood": rep("://a:"),
        "bearer-run": rep("Bearer "),
        "basic-run": rep("Basic QUFB"),
        "sk-run": rep("sk-"),
        "sk-long": "sk-" + "A" * MB,
        "quote-run": rep('"password": "'),
        "backslash-run": rep('password=\\"'),
        "spaces": " " * MB,
        "password-spaces": rep("password" + " " * 50),
        "name-run": "x" * MB + "_token=",
        "digits-AA": rep("123456789:AA"),
        "Q-tilde": rep("aaa1Q~"),
        "pem-body-no-end": "-----BEGIN RSA PRIVATE KEY-----\n" + rep("QUJD\n"),
        "kv-json-escaped": rep('{\\"token\\": \\"'),
        "underscores": rep("npm_ghp_gho_"),
        "non-secret-key-colons": rep("key:"),
        "placeholder-values": rep("password=$"),
        "code-values": rep("token=token "),
        "flag-names": rep("--password "),
        "name-dash-run": rep("-" * 60 + "token:"),
        "quoted-placeholder-spaces": rep('password:"$ '),
        "telegram-flood": rep("x1234567890:AA" + "b" * 33 + " "),
        "discord-flood": "discord " + rep("M" + "a" * 23 + ".bbbbbb." + "c" * 27 + " "),
        "config-set-run": rep("config set a_token "),
        "stdin-run": rep("echo x | --password-stdin "),
        "xml-named-run": rep('key="password" '),
        "percent-escapes": rep("%3D"),
        "unicode-escapes": rep("\\u0022"),
        "userinfo-at-run": "https://" + rep("a:b@"),
        "maxmind-shape-run": rep("_" + "A" * 29),
        "lone-line-run": rep("$ op read x\nA1b2C3d4E5f6G7\n"),
        "cli-flag-run": rep("curl -u -p "),
        "htpasswd-run": rep("htpasswd -b "),
        "base64-pem-run": rep("LS0tLS1CRUdJT"),
        "base64-token-long": "Z2hwX" + "A" * MB,
        "dash-run": "-" * MB,
        "prefix-run": rep("sk-proj-"),
    }


@pytest.mark.timeout(30)
def test_adversarial_inputs_are_linear():
    # pytest-timeout fails this on catastrophic backtracking; timing itself lives in
    # tests/bench_redaction.py. (Each 1 MB shape takes milliseconds to ~0.3 s.)
    r = redactor(env={"API_TOKEN": "Zk29dLq81xWm"})
    for name, text in adversarial_inputs().items():
        out = r.redact(text)
        assert isinstance(out, str) and len(out) <= 2 * len(text), name


@pytest.mark.timeout(30)
def test_adversarial_input_through_cli(tmp_path):
    data = "Authorization: " * 70000 + "\n" + "-----BEGIN RSA PRIVATE KEY-----" * 30000
    proc = run_bridge("redact", "--root", tmp_path, input=data, timeout=25)
    assert proc.returncode == 0, proc.stderr


def test_cli_stops_quietly_when_the_reader_goes_away(tmp_path):
    proc = subprocess.Popen([PYTHON, str(BRIDGE), "redact", "--root", str(tmp_path)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=clean_env())
    proc.stdout.close()
    try:
        proc.stdin.write(b"password=hunter2 and more\n" * 200000)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    assert proc.wait(timeout=30) == 1
    assert proc.stderr.read() == b""


def test_random_mixtures_never_raise_and_never_keep_a_token():
    # Fragments that trigger every rule, glued at random around real-shaped tokens.
    pieces = ["password", "=", ":", " ", '"', "\\", "'", "token", "key", "api_", "Bearer ",
              "Basic ", "-----BEGIN RSA PRIVATE KEY-----", "-----END", "\n", "eyJ", "abc123",
              "sk-", "ghp_", "://", "@", "AKIA", "\u00e9", "\udcff", "\x00", "Authorization",
              ": ", "x" * 20, "A1b2" * 6, "$", "{", R, "--token ", "Cookie: ", ":AA", "Q~", "."]
    tokens = ["ghp_" + rnd(36), "sk-ant-api03-" + rnd(93, URLSAFE) + "AA", "AKIA" + rnd(16, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"),
              "xoxb-" + rnd(12, string.digits) + "-" + rnd(13, string.digits) + "-" + rnd(24)]
    rng = random.Random(11)
    r = redactor(env={"API_TOKEN": "Zk29dLq81xWm"})
    for _ in range(3000):
        token = rng.choice(tokens)
        parts = [rng.choice(pieces) for _ in range(rng.randint(0, 12))]
        parts.insert(rng.randint(0, len(parts)), " %s " % token)
        text = "".join(parts) + rng.choice(["", " Zk29dLq81xWm "])
        out = r.redact(text)
        assert token not in out and "Zk29dLq81xWm" not in out, repr(text)
