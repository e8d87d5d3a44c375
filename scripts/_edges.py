"""Print the installed versions of the dependencies whose edges statecodec leans on.

CI's logs then show which releases a run proved (scripts/test-on, .ci/run); the same
names are pinned to their lowest allowed versions in .ci/lowest.txt.
"""

from importlib.metadata import PackageNotFoundError, version

EDGES = ("mcp", "fastmcp", "redis", "hiredis", "cryptography", "pynacl")


def main() -> None:
    found = []
    for name in EDGES:
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            found.append(f"{name} (not installed)")
    print("dependencies:", ", ".join(found), flush=True)


if __name__ == "__main__":
    main()
