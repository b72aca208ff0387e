#!/usr/bin/env bash
# A Chromium for the browser tests (marker `browser`: Playwright, installed with .[dev], drives the
# system Chromium; no browser is ever downloaded by Playwright). Only the test command needs it
# (scripts/test.sh sources this file); the set-up and the demo do not. Missing, it is installed with
# apt-get when we are root and apt-get exists; if that fails (no network, not Debian, not root)
# the test command stops with exit status 1, because the suite runs the browser tier. Outside CI,
# SITELENS_NO_CHROMIUM=1 lets it go on without the browser tier.
have_chromium() {
  { [ -n "${SITELENS_CHROMIUM:-}" ] && [ -x "$SITELENS_CHROMIUM" ]; } || [ -x /usr/bin/chromium ] \
    || command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
    || command -v google-chrome >/dev/null 2>&1
}
if ! have_chromium; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test: no Chromium found; apt-get install -y chromium (for the browser tests)"
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 \
           && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1; }; } || true
  fi
  if ! have_chromium; then
    msg="test: error: no Chromium for the browser tests and it could not be installed here"
    msg="$msg (as root: apt-get install -y chromium; or set SITELENS_CHROMIUM to a Chromium executable)"
    if [ -n "${CI:-}" ] || [ -z "${SITELENS_NO_CHROMIUM:-}" ]; then
      echo "$msg" >&2
      exit 1
    fi
    echo "$msg; going on without the browser tier because SITELENS_NO_CHROMIUM is set" >&2
    export SITELENS_SKIP_BROWSER=1
  fi
fi
