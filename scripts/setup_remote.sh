#!/usr/bin/env sh
# The remote tier's extra (Mooncake Store's client and master) and the system libraries its wheel links
# against.  Never fatal: without them the remote tier's tests skip, each saying why.
cd "$(dirname "$0")/.."
libs="libibverbs.so.1 librdmacm.so.1 libnuma.so.1"
missing=""
for lib in $libs; do
  ldconfig -p 2>/dev/null | grep -q "$lib" || missing="$missing $lib"
done
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing libibverbs1 librdmacm1 libnuma1 (apt-get; missing:$missing) ..." >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 librdmacm1 libnuma1) \
      >&2 || echo "apt-get failed: the remote tier's tests will skip" >&2
  else
    echo "missing$missing and cannot apt-get (not root or no apt): the remote tier's tests will skip" >&2
  fi
fi
.venv/bin/python -m pip install --quiet -e '.[remote]' >&2 \
  || echo "pip install '.[remote]' failed: the remote tier's tests will skip" >&2
exit 0
