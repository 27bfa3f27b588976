"""What the scripts that drive `cleave serve` with the official `openai`
package share: checks that stop at the first failure, and the summary line
the Rust tests look for."""

import sys

checks = 0


def check(condition, what):
    global checks
    if not condition:
        sys.exit(f"FAILED: {what}")
    checks += 1


def summary():
    return f"{checks} passed, 0 failed"
