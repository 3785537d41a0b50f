"""Redaction on a held-out set: secrets and ordinary output written independently of the
rules and of tests/redaction_corpus.py (by a reviewer who had not read either), so recall
and false positives here are measured, not fitted. Fake secrets are built at run time.
"""
import base64
import random
import string
import subprocess

import pytest

from conftest import BRIDGE, PYTHON, clean_env, load_bridge

bridge = load_bridge()

_rng = random.Random(20261126)
AL = string.ascii_letters + string.digits
HEX = "0123456789abcdef"
LOW = string.ascii_lowercase + string.digits


def r(n, alphabet=AL):
    """Random, with a digit and both cases when the alphabet allows (a real secret's look)."""
    while True:
        s = "".join(_rng.choice(alphabet) for _ in range(n))
        if alphabet != AL or n < 6 or (any(c.isdigit() for c in s) and s.lower() != s != s.upper()):
            return s


def b64(s):
    return base64.b64encode(s.encode()).decode()


def jwt():
    head = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').decode().rstrip("=")
    body = base64.urlsafe_b64encode(('{"sub":"%s","iat":1700000000}' % r(8)).encode()).decode().rstrip("=")
    return "%s.%s.%s" % (head, body, r(43, AL + "-_"))


def positives():
    """(text, secret) pairs: the secret must leave no raw part of itself (8+ chars) behind."""
    P = []

    def add(template, secret):
        P.append((template.replace("@S@", secret), secret))

    # token formats (gitleaks shapes)
    toks = [
        "ghp_" + r(36), "gho_" + r(36), "ghs_" + r(36), "ghu_" + r(36), "ghr_" + r(36),
        "github_pat_" + r(22) + "_" + r(59), "glpat-" + r(20, AL + "-_"),
        "xoxb-" + r(11, "0123456789") + "-" + r(12, "0123456789") + "-" + r(24),
        "xoxp-" + r(11, "0123456789") + "-" + r(11, "0123456789") + "-" + r(12, "0123456789") + "-" + r(32, HEX),
        "xapp-1-A" + r(10, "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ") + "-" + r(13, "0123456789") + "-" + r(64, HEX),
        "sk_live_" + r(24), "rk_live_" + r(24), "sk_test_" + r(30), "whsec_" + r(32),
        "sk-proj-" + r(48, AL + "-_"), "sk-" + r(20) + "T3BlbkFJ" + r(20),
        "sk-ant-api03-" + r(93, AL + "-_") + "AA", "AKIA" + r(16, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"),
        "ASIA" + r(16, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"), "AIza" + r(35, AL + "-_"),
        "ya29." + r(60, AL + "-_"), "SK" + r(32, HEX), "AC" + r(32, HEX),
        "key-" + r(32, HEX), "sq0csp-" + r(43, AL + "-_"), "EAAA" + r(60, AL + "-_"),
        "pscale_tkn_" + r(43, AL + "-_."), "sntrys_" + "eyJpYXQiOjE3MDAwMDAwMDB9" + r(40, AL),
        "glsa_" + r(32) + "_" + r(8, HEX), "glc_" + r(40, AL + "+/") + "==",
        "sbp_" + r(40, HEX), "npm_" + r(36), "pypi-AgEIcHlwaS5vcmc" + r(60, AL + "-_"),
        "dckr_pat_" + r(27, AL + "-_"), "dapi" + r(32, HEX), "dop_v1_" + r(64, HEX),
        "shpat_" + r(32, HEX), "shpss_" + r(32, HEX), "hvs." + r(90, AL + "-_"),
        "dp.pt." + r(43), "lin_api_" + r(40), "ntn_" + r(11, "0123456789") + r(35),
        "ATATT3xFfGF0" + r(170, AL + "-_=") + "=" + r(8, HEX.upper()), "HRKU-" + r(60, AL + "-_"),
        "PMAK-" + r(24, HEX) + "-" + r(34, HEX), "pul-" + r(40, HEX),
        "dt0c01." + r(24, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567") + "." + r(64, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"),
        "xkeysib-" + r(64, HEX) + "-" + r(16), "hf_" + r(34, string.ascii_letters),
        "gsk_" + r(52), "r8_" + r(37), "xai-" + r(80), "pplx-" + r(48),
        "nvapi-" + r(64, AL + "-_"), "sgp_" + r(40, HEX), "sqp_" + r(40, HEX),
        "LTAI" + r(20), "NRAK-" + r(27, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"),
        "AGE-SECRET-KEY-1" + r(58, "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L"),
        "shppa_" + r(32, HEX), "fo1_" + r(43, AL + "-_"), "sk-or-v1-" + r(64, HEX),
        "glrt-" + r(20, AL + "-_"), "sntryu_" + r(64, HEX), "ops_eyJ" + r(250, AL + "+/"),
    ]
    ctx = ["remote: using token {} for push", "export TOKEN_VALUE={}", "Authorization: token {}",
           '{{"value": "{}", "ok": true}}', "  token: {}", "DEBUG request headers={{'x': '{}'}}",
           "echo {} | gh auth login --with-token", "[2026-11-26T10:00:01Z] got credential {}",
           "notes_{}", "<value>{}</value>"]
    for i, t in enumerate(toks):
        add(ctx[i % len(ctx)].format("@S@"), t)
    add("Authorization: Bearer @S@", jwt())
    add("curl -H 'Authorization: Bearer @S@' https://api.example.com/v1/me", r(40, AL + "-_."))
    add("> Authorization: Basic @S@", b64("deploy:" + r(14)))
    add("Cookie: sessionid=@S@; csrftoken=abc", r(32, LOW))
    add("set-cookie: __Host-session=@S@; Path=/; Secure; HttpOnly", r(40, AL + "-_"))
    add("X-Api-Key: @S@", r(32, HEX))
    add('"x-api-key": "@S@",', r(40))
    add("X-Auth-Token: @S@", r(36, AL + "-"))
    add("PRIVATE-TOKEN: @S@", r(20, AL + "-_"))
    # key = value, .env, yaml, json
    for key, sep in [("password", "="), ("DB_PASSWORD", "="), ("client_secret", "="),
                     ("api_key", "="), ("secret", ": "), ("POSTGRES_PASSWORD", "="),
                     ("MYSQL_ROOT_PASSWORD", "="), ("AWS_SECRET_ACCESS_KEY", "="),
                     ("STRIPE_SECRET_KEY", "="), ("SENTRY_AUTH_TOKEN", "="), ("JWT_SECRET", "="),
                     ("SECRET_KEY_BASE", "="), ("REDIS_PASSWORD", ": "), ("smtp_password", " = "),
                     ("adminPassword", ": "), ("apiKey", ": "), ("accessToken", "="),
                     ("refresh_token", "="), ("private_key", " = "), ("encryption_key", "=")]:
        add(key + sep + "@S@", r(18))
    add("password=@S@", "Passw0rd2024")
    add("DB_PASSWORD=@S@", "SuperSecret123")
    add("api_key=@S@", "monkey9Xq2LmN7")
    add("secret: @S@", "keystone42Aa")
    add("password=@S@ user=admin", "Tr0ub4dor&3xyz")
    add('DATABASE_PASSWORD="@S@"', "p@ss#w0rd?x%2B/9")
    add("  password: '@S@'", "hunter2-Hunter2!")
    add('{"username": "svc", "password": "@S@"}', "Zq9!xL2#mW8$")
    add('{"auths":{"registry.example.com":{"auth":"@S@"}}}', b64("ci:" + r(20)))
    add("//registry.npmjs.org/:_authToken=@S@", "npm_" + r(36))
    add("//npm.pkg.github.com/:_authToken=@S@", r(36))
    add("_auth=@S@", b64("me:" + r(16)))
    add("[pypi]\nusername = __token__\npassword = @S@\n", "pypi-AgEIcHlwaS5vcmc" + r(50, AL + "-_"))
    add("machine api.github.com login bot password @S@", r(30))
    add("    client-key-data: @S@", b64("-----BEGIN RSA PRIVATE KEY-----\n" + r(64, AL + "+/") + "\n-----END RSA PRIVATE KEY-----\n"))
    add("    token: @S@", r(40, AL + "-_."))
    add("<password>@S@</password>", r(16))
    add('<server><id>nexus</id><username>ci</username><password>@S@</password></server>', r(20))
    add('<add key="ClearTextPassword" value="@S@" />', r(18))
    add('Server=db;Database=app;User Id=sa;Password=@S@;TrustServerCertificate=True', r(14) + "!")
    add('DefaultEndpointsProtocol=https;AccountName=st1;AccountKey=@S@;EndpointSuffix=core.windows.net', r(86, AL + "+/") + "==")
    add("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=@S@", r(43, AL + "+/") + "=")
    add('<connectionStrings><add name="db" connectionString="Data Source=x;Pwd=@S@;"/></connectionStrings>', r(15))
    add("[default]\naws_secret_access_key = @S@\n", r(40, AL + "+/"))
    add('variable "db" { default = "x" }\npassword = "@S@"', r(20))
    add("spring.datasource.password=@S@", r(16))
    # URLs and connection strings
    add("postgres://app:@S@@db.internal:5432/app", r(16))
    add("DATABASE_URL=postgresql://user:@S@@localhost/db", "pa#ss&wo?rd" + r(6))
    add("mongodb+srv://admin:@S@@cluster0.abcde.mongodb.net/test", r(20))
    add("redis://:@S@@cache:6379/0", r(24))
    add("amqp://guest:@S@@rabbit:5672/", r(18))
    add("Cloning into 'x'...\nfatal: unable to access 'https://oauth2:@S@@gitlab.com/g/p.git/'", r(20, AL + "-_"))
    add("git clone https://x-access-token:@S@@github.com/org/repo.git", "ghs_" + r(36))
    add("https://user:@S@@example.com/path", "p%40ss" + r(10))
    # command-line flags
    add("curl -u admin:@S@ https://api.example.com", r(14))
    add("curl --user 'deploy:@S@' -X POST", r(16))
    add("docker login -u ci -p @S@ registry.example.com", r(20))
    add("docker login --password @S@ ghcr.io", r(20))
    add("mysql -uroot -p@S@ -h 127.0.0.1", r(14))
    add("mysql --password=@S@ app", r(14))
    add("sshpass -p '@S@' ssh u@h", r(12))
    add("openssl pkcs12 -export -in c.pem -passout pass:@S@ -out c.p12", r(14))
    add("htpasswd -b -c .htpasswd admin @S@", r(14))
    add("redis-cli -a @S@ ping", r(20))
    add("kubectl create secret generic db --from-literal=password=@S@", r(16))
    add("helm upgrade app ./chart --set db.password=@S@", r(16))
    add("java -Djavax.net.ssl.keyStorePassword=@S@ -jar app.jar", r(14))
    add("PGPASSWORD=@S@ psql -h db -U app", r(16))
    add("+ terraform apply -var 'db_password=@S@'", r(16))
    add("npm config set //registry.npmjs.org/:_authToken @S@", "npm_" + r(36))
    add("ENV API_TOKEN=@S@", r(32))
    add("Step 5/9 : ARG NPM_TOKEN=@S@", "npm_" + r(36))
    add("docker run -e POSTGRES_PASSWORD=@S@ postgres:16", r(16))
    # encoded
    add("data:\n  password: @S@\n", b64(r(20)))
    add("token%3D@S@%26x%3D1", r(24))
    add('"{\\"password\\": \\"@S@\\"}"', r(16))
    add("url=https%3A%2F%2Fbot%3A@S@%40example.com", r(20))
    add("  \"auth\": \"@S@\"", b64("user:" + r(18)))
    # lone secret after printing command
    add("$ kubectl get secret db -o jsonpath='{.data.password}' | base64 -d\n@S@\n", r(24))
    add("$ vault kv get -field=password secret/db\n@S@\n", r(22))
    add("$ aws configure get aws_secret_access_key\n@S@\n", r(40, AL + "+/"))
    add("$ gcloud auth print-access-token\n@S@\n", "ya29." + r(120, AL + "-_"))
    add("$ op read op://vault/db/password\n@S@\n", r(20))
    # private keys
    body = "\n".join(r(64, AL + "+/") for _ in range(6))
    add("-----BEGIN OPENSSH PRIVATE KEY-----\n@S@\n-----END OPENSSH PRIVATE KEY-----", body)
    body2 = "\n".join(r(64, AL + "+/") for _ in range(4))
    add('{"private_key": "-----BEGIN PRIVATE KEY-----\\n@S@\\n-----END PRIVATE KEY-----\\n"}', body2.replace("\n", "\\n"))
    # stack traces with credentials
    add("psycopg2.OperationalError: connection to server at \"db\" failed: FATAL: password authentication failed for user \"app\"\n  dsn='host=db user=app password=@S@ dbname=app'", r(16))
    add("sqlalchemy.exc.OperationalError: (pymysql.err.OperationalError) (1045)\n(Background on this error: mysql+pymysql://root:@S@@db/app)", r(16))
    add("requests.exceptions.HTTPError: 401 Client Error for url: https://api.example.com/v2?access_token=@S@&page=2", r(32))
    add("Traceback ...\n  File \"app.py\", line 4, in <module>\n    client = Client(api_key=\"@S@\")", r(32))
    add("WARN  webhook https://hooks.slack.com/services/T@S@", r(8, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") + "/B" + r(10, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") + "/" + r(24))
    add("discord: https://discord.com/api/webhooks/123456789012345678/@S@", r(68, AL + "-_"))
    add("bot https://api.telegram.org/bot@S@/sendMessage", "1234567890:AA" + r(33, AL + "-_"))
    # harder shapes seen in real output
    add("export AWS_SESSION_TOKEN=@S@", r(300, AL + "+/") + "==")
    add("::add-mask::@S@", r(24))
    add("kubectl set env deploy/api API_KEY=@S@", r(32))
    add("heroku config:set STRIPE_API_KEY=@S@ -a app", "sk_live_" + r(24))
    add("git remote set-url origin https://bot:@S@@github.com/org/repo", "ghp_" + r(36))
    add("registry=https://npm.example.com/\n//npm.example.com/:_password=@S@", b64(r(14)))
    add("password = \"@S@\"  # rotated 2026-11", "c0rrect horse battery Staple9")
    add("ssh -i key.pem ubuntu@1.2.3.4 'echo @S@ | sudo -S apt update'", r(14))
    add("{'Authorization': 'Token @S@'}", r(40, HEX))
    add("proxy: http://proxyuser:@S@@proxy.corp:3128", r(14))
    add("  - --token=@S@", r(40))
    add("jdbc:mysql://db:3306/app?user=app&password=@S@&useSSL=true", r(16))
    add("aws_session_token = @S@", r(200, AL + "+/"))
    add("ANTHROPIC_API_KEY=@S@ claude -p hello", "sk-ant-api03-" + r(93, AL + "-_") + "AA")
    add("OPENAI_API_KEY: '@S@'", "sk-" + r(48))
    add("  secretAccessKey: @S@", r(40, AL + "+/"))
    add("<entry key=\"db.password\">@S@</entry>", r(16))
    add("token=@S@", r(9000))                          # a value over a rule's 4 KiB bound
    add('{"access_token": "@S@"}', r(6000, AL + "-_."))
    add("Authorization: Bearer @S@", r(5000, AL + "-_.~+/"))
    add("Authorization: Bearer @S@", "eyJhbGciOiJSUzI1NiIsImtpZCI6" + r(40) + "." + r(100) + "." + r(200, AL + "-_"))
    return P


def negatives():
    """Ordinary output that must come back byte for byte."""
    sha = lambda: r(40, HEX)
    uuid = lambda: "%s-%s-%s-%s-%s" % (r(8, HEX), r(4, HEX), r(4, HEX), r(4, HEX), r(12, HEX))
    N = [
        "commit %s\nAuthor: Jane Doe <jane@example.com>\nDate:   Thu Nov 26 10:00:00 2026 +0000\n\n    Fix token refresh when password is empty" % sha(),
        "diff --git a/src/auth.py b/src/auth.py\nindex %s..%s 100644\n--- a/src/auth.py\n+++ b/src/auth.py\n@@ -10,7 +10,7 @@ def login(user, password):\n-    token = get_token(user)\n+    token = get_token(user, password=password)" % (r(7, HEX), r(7, HEX)),
        "%s (HEAD -> main, origin/main) Merge pull request #42 from org/secret-rotation" % r(7, HEX),
        "Merge: %s %s" % (r(7, HEX), r(7, HEX)),
        "Switched to a new branch 'feature/api-key-rotation'",
        "To github.com:org/repo.git\n   %s..%s  main -> main" % (r(7, HEX), r(7, HEX)),
        "remote: Resolving deltas: 100% (12/12), completed with 4 local objects.",
        "HEAD is now at %s Add password reset email template" % r(7, HEX),
        "tests/test_auth.py::test_password_reset PASSED                            [ 40%]",
        "tests/test_auth.py::test_token_expiry FAILED                              [ 60%]",
        "E       AssertionError: assert 'expired' == 'valid'\nE         - valid\nE         + expired",
        "    def test_login(client):\n>       resp = client.post('/login', data={'username': 'u', 'password': 'password'})",
        "FAILED tests/test_api.py::TestKeys::test_rotate_api_key - KeyError: 'api_key'",
        "  File \"/usr/lib/python3.11/site-packages/requests/sessions.py\", line 589, in request\n    resp = self.send(prep, **send_kwargs)",
        "KeyError: 'SECRET_KEY'",
        "django.core.exceptions.ImproperlyConfigured: The SECRET_KEY setting must not be empty.",
        "========================= 132 passed, 2 skipped in 4.21s =========================",
        "added 1423 packages, and audited 1424 packages in 32s",
        "npm WARN deprecated inflight@1.0.6: This module is not supported, and leaks memory.",
        "npm notice New minor version of npm available! 10.2.4 -> 10.9.0",
        "+ jsonwebtoken@9.0.2\n+ passport-local@1.0.0\n+ keytar@7.9.0",
        "npm ERR! code E404\nnpm ERR! 404 Not Found - GET https://registry.npmjs.org/@org%2fsecret-utils - Not found",
        "Collecting cryptography>=41.0\n  Downloading cryptography-42.0.5-cp39-abi3-manylinux_2_28_x86_64.whl (4.6 MB)",
        "Successfully installed keyring-24.3.1 python-dotenv-1.0.1 secretstorage-3.3.3",
        "  Hash: sha256:%s" % r(64, HEX),
        "requests==2.31.0 --hash=sha256:%s" % r(64, HEX),
        "   Compiling ring v0.17.8\n   Compiling rustls v0.22.4\n    Finished release [optimized] target(s) in 1m 02s",
        "warning: unused variable: `token`\n --> src/main.rs:12:9\n   |\n12 |     let token = parse(&input);",
        "go: downloading golang.org/x/crypto v0.21.0\ngo: downloading github.com/golang-jwt/jwt/v5 v5.2.1",
        "github.com/golang-jwt/jwt/v5 v5.2.1 h1:%s=" % r(43, AL + "+/"),
        "ok  \tgithub.com/org/svc/internal/auth\t0.412s\tcoverage: 81.2% of statements",
        "--- FAIL: TestTokenValidate (0.00s)\n    token_test.go:31: expected error for expired token",
        "Step 4/12 : RUN pip install --no-cache-dir -r requirements.txt\n ---> Running in %s" % r(12, HEX),
        "#8 [builder 3/6] RUN --mount=type=secret,id=npmrc npm ci\n#8 DONE 41.2s",
        "sha256:%s" % r(64, HEX),
        "writing image sha256:%s done" % r(64, HEX),
        "ghcr.io/org/app@sha256:%s" % r(64, HEX),
        "%s   postgres:16   \"docker-entrypoint.s…\"   2 hours ago   Up 2 hours   5432/tcp   db" % r(12, HEX),
        "NAME                      READY   STATUS    RESTARTS   AGE\napi-7d9f8c6b5d-x2k9p      1/1     Running   0          3d",
        "NAME                  TYPE                                  DATA   AGE\ndb-credentials        Opaque                                2      14d\ndefault-token-x7k2m   kubernetes.io/service-account-token   3      90d",
        "secret/db-credentials created",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: api\nspec:\n  template:\n    spec:\n      containers:\n      - name: api\n        image: ghcr.io/org/api:1.4.2\n        env:\n        - name: DB_PASSWORD\n          valueFrom:\n            secretKeyRef:\n              name: db-credentials\n              key: password",
        "        envFrom:\n        - secretRef:\n            name: app-secrets",
        "      volumes:\n      - name: tls\n        secret:\n          secretName: api-tls",
        "  # aws_secretsmanager_secret.db will be created\n  + resource \"aws_secretsmanager_secret\" \"db\" {\n      + arn  = (known after apply)\n      + name = \"prod/db/password\"\n    }",
        "      + password = (sensitive value)",
        "Plan: 3 to add, 0 to change, 0 to destroy.",
        "aws_iam_access_key.ci: Creation complete after 1s [id=AKIAIOSFODNN7EXAMPLE]",
        "arn:aws:secretsmanager:us-east-1:123456789012:secret:prod/db-password-AbCdEf",
        "arn:aws:iam::123456789012:role/github-actions-deploy",
        "module.vpc.aws_subnet.private[0]: Refreshing state... [id=subnet-0a1b2c3d4e5f67890]",
        "region = ap-southeast-2\nASIAPACIFICSOUTHEAST",
        '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"claude-code","version":"1.0.3"}}}',
        '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"src/token_store.py"}}}',
        '{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"def get_password(prompt):\\n    return getpass.getpass(prompt)"}]}}',
        '{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"%s","progress":50,"total":100}}' % uuid(),
        '{"jsonrpc":"2.0","id":3,"result":{"tools":[{"name":"create_api_key","description":"Creates an API key","inputSchema":{"type":"object","properties":{"name":{"type":"string"}}}}]}}',
        "request_id=%s trace_id=%s" % (uuid(), r(32, HEX)),
        "build-id: %s" % r(40, HEX),
        "Run ID: %s  Attempt: 1" % r(10, "0123456789"),
        "Version: 3.12.4+build.20261126.%s" % r(7, HEX),
        '<img src="data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAABAAAAAQCAYAAAAf8/9hAAAA%s" />' % r(200, AL + "+/"),
        "!function(e){var t={};function n(r){if(t[r])return t[r].exports;var o=t[r]={i:r,l:!1,exports:{}};return e[r].call(o.exports,o,o.exports,n),o.l=!0,o.exports}n.m=e,n.c=t}([function(e,t,n){\"use strict\";var r=n(1),o=n(2);e.exports={token:r.token,key:o.key}}]);",
        "const a=\"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+/\";",
        "password: ${DB_PASSWORD}",
        "api_key: \"{{ .Values.apiKey }}\"",
        "token=<your-token-here>",
        "SECRET_KEY=your-secret-key-here",
        "password=********",
        "Authorization: Bearer [REDACTED]",
        "GITHUB_TOKEN: ${{ secrets.GITHUB_TOKEN }}",
        "  env:\n    NPM_TOKEN: ${{ secrets.NPM_TOKEN }}",
        "Using token gho_**** from keyring",
        "password=",
        "secret_name: prod/db/password",
        "key_id: %s" % uuid(),
        "Fingerprint: SHA256:%s" % r(43, AL + "+/"),
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI%s user@laptop" % r(43, AL + "+/"),
        "The key's randomart image is:\n+--[ED25519 256]--+\n|      .o+=*B*o   |\n+----[SHA256]-----+",
        "-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+gAwIBAgIE%s\n-----END CERTIFICATE-----" % r(60, AL + "+/"),
        "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8A%s\n-----END PUBLIC KEY-----" % r(60, AL + "+/"),
        "gpg: key %s: public key \"Jane <jane@example.com>\" imported" % r(16, HEX.upper()),
        "  integrity sha512-%s==" % r(86, AL + "+/"),
        '"resolved": "https://registry.npmjs.org/lodash/-/lodash-4.17.21.tgz",\n"integrity": "sha512-%s=="' % r(86, AL + "+/"),
        "checksum = \"%s\"" % r(64, HEX),
        "etag: W/\"%s\"" % r(32, HEX),
        "x-request-id: %s" % uuid(),
        "Content-Type: application/json; charset=utf-8",
        "Cache-Control: no-store, max-age=0",
        "WWW-Authenticate: Bearer realm=\"api\", error=\"invalid_token\"",
        "HTTP/1.1 401 Unauthorized",
        "Set-Cookie: theme=dark; Path=/",
        "Accept-Encoding: gzip, deflate, br",
        "git@github.com:org/repo.git",
        "https://github.com/org/repo/blob/%s/src/auth/token.py#L42" % sha(),
        "https://example.com/search?q=password+reset&page=2",
        "http://localhost:8080/api/v1/keys?limit=50",
        "ssh://git@gitlab.example.com:2222/group/project.git",
        "docker run -u 1000:1000 -p 8080:80 nginx:1.27",
        "mysql -u app -p appdb",
        "psql -h localhost -p 5432 -U postgres",
        "curl -sS -o /dev/null -w '%{http_code}' https://example.com",
        "openssl req -new -key server.key -out server.csr",
        "ssh-keygen -t ed25519 -C ci@example.com -f ~/.ssh/id_ci",
        "Generating public/private ed25519 key pair.\nYour identification has been saved in /home/u/.ssh/id_ci",
        "tokenizer.json: 100%|██████████| 2.11M/2.11M [00:00<00:00, 12.3MB/s]",
        "max_tokens=4096 temperature=0.2 model=claude-sonnet-4-5",
        "Input tokens: 12,431  Output tokens: 2,118  Cache read: 80,221",
        "TOKENIZERS_PARALLELISM=false",
        "KeyboardInterrupt",
        "[INFO] Building jar: /build/target/app-1.0.0-SNAPSHOT.jar",
        "[INFO] BUILD SUCCESS\n[INFO] Total time:  01:12 min",
        "> Task :app:compileKotlin\nBUILD SUCCESSFUL in 48s\n17 actionable tasks: 17 executed",
        "at com.example.auth.TokenService.validate(TokenService.java:88)\n\tat com.example.auth.AuthFilter.doFilterInternal(AuthFilter.java:41)",
        "java.lang.IllegalStateException: Password must be at least 12 characters",
        "    at Object.<anonymous> (/app/node_modules/jsonwebtoken/verify.js:75:19)",
        "TypeError: Cannot read properties of undefined (reading 'accessToken')",
        "Error: connect ECONNREFUSED 127.0.0.1:5432",
        "ERROR 1045 (28000): Access denied for user 'root'@'localhost' (using password: YES)",
        "FATAL:  password authentication failed for user \"postgres\"",
        "Please enter your password:",
        "Password:",
        "Enter passphrase for key '/home/u/.ssh/id_ed25519':",
        "Login Succeeded",
        "WARNING! Your password will be stored unencrypted in /home/u/.docker/config.json.",
        "The authenticity of host 'github.com (140.82.121.4)' can't be established.\nED25519 key fingerprint is SHA256:%s." % r(43, AL + "+/"),
        "  %s  node_modules/.bin/esbuild" % r(64, HEX),
        "%s  dist/app-linux-amd64.tar.gz" % r(64, HEX),
        "md5: %s" % r(32, HEX),
        "Digest: sha256:%s\nStatus: Downloaded newer image for python:3.12-slim" % r(64, HEX),
        "id: %s\nrev: 3-%s" % (uuid(), r(32, HEX)),
        "session_id=%s" % uuid(),
        "object_key: uploads/2026/11/%s.png" % uuid(),
        "cache key: Linux-node-%s" % r(64, HEX),
        "Cache restored from key: pip-Linux-%s" % r(64, HEX),
        "##[group]Run actions/checkout@v4\nwith:\n  repository: org/repo\n  token: ***\n  ssh-strict: true\n##[endgroup]",
        "  AWS_REGION: us-east-1\n  AWS_ACCESS_KEY_ID: ***\n  AWS_SECRET_ACCESS_KEY: ***",
        "Running on runner ubuntu-24.04 (runner id 1234, %s)" % uuid(),
        "Job succeeded",
        "Uploading artifacts for successful job\nUploading artifacts...\ncoverage.xml: found 1 matching artifact files and directories",
        "$ git rev-parse HEAD\n%s" % sha(),
        "$ base64 -d <<< aGVsbG8gd29ybGQ=\nhello world",
        "$ cat ~/.ssh/id_ed25519.pub\nssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI%s u@h" % r(43, AL + "+/"),
        "terraform {\n  required_providers {\n    aws = {\n      source  = \"hashicorp/aws\"\n      version = \"~> 5.0\"\n    }\n  }\n}",
        "resource \"kubernetes_secret\" \"db\" {\n  metadata {\n    name = \"db\"\n  }\n  data = {\n    password = var.db_password\n  }\n}",
        "variable \"db_password\" {\n  type      = string\n  sensitive = true\n}",
        "[tool.poetry.dependencies]\npython = \"^3.11\"\npyjwt = \"^2.8\"",
        "import { createHash } from 'node:crypto';\nconst key = createHash('sha256').update(input).digest('hex');",
        "def rotate_secret(client, secret_id: str) -> None:",
        "  self.assertEqual(token.kind, TokenKind.IDENT)",
        "INFO  [alembic.runtime.migration] Running upgrade %s -> %s, add api_keys table" % (r(12, HEX), r(12, HEX)),
        "CREATE TABLE api_keys (id uuid PRIMARY KEY, key_hash text NOT NULL, created_at timestamptz);",
        "2026-11-26T10:00:01.123Z INFO server listening on 0.0.0.0:8443 (tls=true)",
        "172.17.0.1 - - [26/Nov/2026:10:00:01 +0000] \"GET /healthz HTTP/1.1\" 200 2 \"-\" \"kube-probe/1.29\"",
        "wrote 42 files, %d bytes, ETA 0:00:01" % 123456,
        "Downloaded https://objects.githubusercontent.com/github-production-release-asset-2e65be/%s/%s" % (r(9, "0123456789"), uuid()),
        "node_modules/.pnpm/@babel+core@7.24.0/node_modules/@babel/core/lib/index.js",
        "%s" % r(7, HEX),
        "ey: the value starts with ey but is not a token",
        "MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA is the start of a public key",
        "The token endpoint returned 200 in 31ms",
        "A3-BOOK-TITLE-ROUND",
        "AKIA is the prefix of AWS access key ids",
        "Issuer: CN=R11, O=Let's Encrypt, C=US",
        "  Serial Number: %s" % ":".join(r(2, HEX) for _ in range(16)),
    ]
    return N


def _leaked(text, out, secret):
    """A raw part of the secret left in `out`: any 8-character piece of it (the whole of a
    shorter line) that `out` holds and the text around the secret did not."""
    around = text.replace(secret, "\0")
    for piece in (p for p in secret.replace("\\n", "\n").split("\n") if p):
        for i in range(max(1, len(piece) - 7)):
            window = piece[i:i + 8]
            if window in out and window not in around:
                return window
    return None


def measure():
    red = bridge.Redactor(env={})
    misses = [(text, secret, red.redact(text)) for text, secret in positives()
              if _leaked(text, red.redact(text), secret)]
    fps = [(text, red.redact(text)) for text in negatives() if red.redact(text) != text]
    return misses, fps


def test_heldout_recall_and_false_positives():
    misses, fps = measure()
    npos, nneg = len(positives()), len(negatives())
    assert npos >= 150 and nneg >= 150
    recall = 1 - len(misses) / npos
    fp = len(fps) / nneg
    detail = "\n".join("MISS %r -> %r" % (t, o) for t, s, o in misses)
    detail += "\n" + "\n".join("FP   %r -> %r" % (t, o) for t, o in fps)
    assert recall >= 0.99 and fp <= 0.01, "recall %.3f fp %.3f\n%s" % (recall, fp, detail)


def test_cli_pipe_secret_split_at_every_offset():
    """`bridge.py redact` in a pipe: each line is written in two writes, split at every
    offset of the secret in it; a sync line answered before the second write proves the
    first half was read alone. No raw 8 characters of a secret ever come out."""
    secrets = ["ghp_" + r(36), "xoxb-1234567890-1234567890123-" + r(24), jwt(),
               "AKIA" + r(16, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")]
    lines = ["push with %s done" % secrets[0], 'slack {"token":"%s"}' % secrets[1],
             "Authorization: Bearer %s" % secrets[2], "password=%s" % r(20), "id %s" % secrets[3]]
    secrets.insert(3, lines[3][len("password="):])
    proc = subprocess.Popen([PYTHON, str(BRIDGE), "redact"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=clean_env(), text=True, bufsize=1)
    out = []
    try:
        n = 0
        for line, secret in zip(lines, secrets):
            at = line.index(secret)
            for k in range(at, at + len(secret) + 1):
                n += 1
                proc.stdin.write("sync %d\n%s" % (n, line[:k]))
                proc.stdin.flush()
                got = proc.stdout.readline()
                while got != "sync %d\n" % n:          # the first half's line is read
                    assert got, "redact ended early"
                    out.append(got)
                    got = proc.stdout.readline()
                proc.stdin.write(line[k:] + "\n")
                proc.stdin.flush()
        proc.stdin.close()
        out.append(proc.stdout.read())
    finally:
        proc.stdin.close() if not proc.stdin.closed else None
        assert proc.wait(timeout=60) == 0
    text = "".join(out)
    assert text.count(bridge.REDACTED) == n
    for secret in secrets:
        assert not any(secret[i:i + 8] in text for i in range(len(secret) - 7)), secret


@pytest.mark.parametrize("filler", ['{"k":"v"},', "AbCdEfGh12"])
def test_stream_line_without_whitespace_never_passes_a_token_prefix(filler):
    """A line over 64 KiB without a space (minified JSON, one long run) is passed on in
    steps; a token straddling a step's cut must not leave its start raw."""
    red = bridge.Redactor(env={})
    tok = "ghp_" + r(36)
    filler = filler * 20000
    leaks = []
    for pos in range(61440 - len(tok) - 4, 61440 + 4):
        line = filler[:pos] + tok + filler
        stream = red.stream()
        out = "".join(stream.feed(line[i:i + 8192]) for i in range(0, len(line), 8192))
        out += stream.close()
        if any(tok[i:i + 8] in out for i in range(len(tok) - 7)):
            leaks.append(pos)
        assert out.count(bridge.REDACTED) >= 1
    assert not leaks


if __name__ == "__main__":
    misses, fps = measure()
    print("positives %d negatives %d" % (len(positives()), len(negatives())))
    print("recall %.4f  fp %.4f" % (1 - len(misses) / len(positives()), len(fps) / len(negatives())))
    for t, s, o in misses:
        print("MISS", repr(t)[:300], "\n  ->", repr(o)[:300])
    for t, o in fps:
        print("FP  ", repr(t)[:300], "\n  ->", repr(o)[:300])
