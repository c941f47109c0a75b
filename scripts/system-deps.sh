#!/usr/bin/env bash
# System packages the test suite needs beyond PyPI: headless Chromium for the web UI tests.
# Installed only when missing and when we can (root with apt); otherwise those tests skip.
set -u
if command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) \
    >/tmp/arbormem-apt.log 2>&1 || echo "note: could not install chromium (see /tmp/arbormem-apt.log); UI tests will skip"
fi
exit 0
