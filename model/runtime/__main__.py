"""`python -m model.runtime build [--strict]`: compile the decoding runtime now (the Dockerfile and CI do) rather than
when the first model loads; without a compiler it says so and the service decodes eagerly (--strict: exit 1)."""

from __future__ import annotations

import argparse
import sys
import time

from model.runtime.extension import build, build_directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model.runtime", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["build"])
    parser.add_argument("--strict", action="store_true", help="exit 1 when the runtime cannot be built")
    parser.add_argument("--verbose", action="store_true", help="show the compiler's command lines")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        build(verbose=args.verbose)
    except Exception as error:  # noqa: BLE001 - any build failure leaves the eager step, which is what we report
        print(f"decoding runtime: not built ({type(error).__name__}: {str(error).strip()[-500:]}); "
              "the service will decode eagerly", file=sys.stderr)
        return 1 if args.strict else 0
    print(f"decoding runtime: built in {build_directory()} ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
