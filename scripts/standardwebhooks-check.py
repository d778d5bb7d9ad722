#!/usr/bin/env python3
"""Standard Webhooks signatures by the reference implementation (the `standardwebhooks`
package from PyPI), for tests that want a verifier or a signer other than oncely's own.

    scripts/standardwebhooks-check.py [verify]   # one JSON item per line on stdin:
        {"secret": "whsec_…", "headers": {"webhook-id": …, "webhook-timestamp": …,
         "webhook-signature": …}, "body": "<the body as sent>"}
      prints one line per item: {"ok": true} or {"ok": false, "error": "<why>"}

    scripts/standardwebhooks-check.py sign       # one JSON item per line on stdin:
        {"secret": "whsec_…", "id": "msg_…", "timestamp": <Unix seconds>, "body": "…"}
      prints one line per item: {"signature": "v1,<base64>"}

verify checks the timestamp against this machine's clock (5 minutes either way), as the package
does. A line that is not such an item prints {"ok": false, "error": …} (verify) or
{"error": …} (sign). Exit status: 0 when every line was read (whatever the verdicts); 3 with a
line `SKIPPED: …` on stderr when the package cannot be imported (install it with
`python3 -m pip install standardwebhooks`); 2 for a wrong argument.
"""

import json
import sys
from datetime import datetime, timezone


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "verify"
    if mode not in ("verify", "sign"):
        print(f"usage: {sys.argv[0]} [verify|sign] < items.jsonl", file=sys.stderr)
        return 2
    try:
        from standardwebhooks.webhooks import Webhook
    except ImportError as e:
        print(
            f"SKIPPED: the reference package standardwebhooks cannot be imported ({e}); "
            "python3 -m pip install standardwebhooks",
            file=sys.stderr,
        )
        return 3
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            hook = Webhook(item["secret"])
            if mode == "sign":
                at = datetime.fromtimestamp(int(item["timestamp"]), tz=timezone.utc)
                out = {"signature": hook.sign(item["id"], at, item["body"])}
            else:
                hook.verify(item["body"], item["headers"], json_parse=False)
                out = {"ok": True}
        except Exception as e:  # every failure is a verdict, never a crash
            error = f"{type(e).__name__}: {e}"
            out = {"error": error} if mode == "sign" else {"ok": False, "error": error}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
