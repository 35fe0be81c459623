"""The Python tests' one way to run the attn program: (exit code, stdout + stderr)."""
import subprocess


def run(attn, args, cwd):
    r = subprocess.run([attn] + args, cwd=cwd, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr
