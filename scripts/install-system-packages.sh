#!/bin/sh
# System programs some tests use where present: Graphviz's `dot` (the HTML report's graph
# pictures) and Chromium (the report's browser test). Without them those tests skip with a
# message, so this script never fails the set-up: it says what it could not install.
set -u
need=""
command -v dot >/dev/null 2>&1 || need="$need graphviz"
command -v chromium >/dev/null 2>&1 || need="$need chromium"
[ -z "$need" ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-system-packages: no apt-get; install$need yourself (the report tests skip without)" >&2
  exit 0
fi
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
install() { $sudo apt-get install -y -qq --no-install-recommends $need >/dev/null 2>&1; }
# a fresh machine may have no package lists yet: fetch them once and try again
install || { $sudo apt-get update -qq >/dev/null 2>&1 && install; } \
  || echo "install-system-packages: could not install$need; the tests that need them skip" >&2
exit 0
