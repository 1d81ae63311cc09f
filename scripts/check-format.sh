#!/usr/bin/env bash
# Checks that every C++ file git tracks is as clang-format 14 writes it (.clang-format at the
# root). Prints each file that is not, with the command that fixes it, and exits 1; exits 0 when
# the tree is clean. With --fix, rewrites those files in place instead.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
fix=0
case "${1:-}" in
  --fix) fix=1 ;;
  "") ;;
  *) echo "usage: $0 [--fix]" >&2; exit 64 ;;
esac
formatter="${CLANG_FORMAT:-clang-format-14}"
command -v "$formatter" >/dev/null || {
  echo "check-format: $formatter not found (scripts/install-deps.sh installs it)" >&2
  exit 69
}
unclean=()
while IFS= read -r -d '' f; do
  if ! "$formatter" --dry-run -Werror "$f" >/dev/null 2>&1; then
    unclean+=("$f")
  fi
done < <(git ls-files -z -- '*.cc' '*.h')
if [ ${#unclean[@]} -eq 0 ]; then
  exit 0
fi
if [ "$fix" = 1 ]; then
  "$formatter" -i "${unclean[@]}"
  printf 'check-format: formatted %s\n' "${unclean[@]}" >&2
  exit 0
fi
printf 'check-format: not clang-format clean: %s\n' "${unclean[@]}" >&2
echo "check-format: fix with scripts/check-format.sh --fix" >&2
exit 1
