#!/bin/sh
# Headless Chromium and its chromedriver for the browser tests (tests/test_report_browser.py),
# from Debian's packages. Installs only what is missing, and only where apt-get can (root, or
# sudo without a password); elsewhere it says what to install and exits 0, and the browser
# tests then fail with the same advice. Safe to run again: with both present it does nothing.
set -eu
have() { command -v "$1" >/dev/null 2>&1; }
if have chromium && have chromedriver; then
    exit 0
fi
if ! have apt-get; then
    echo "setup_browser: no apt-get here; install Chromium and its chromedriver yourself (the browser tests need both)" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if have sudo && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
        echo "setup_browser: not root; run: sudo apt-get install -y chromium chromium-driver" >&2
        exit 0
    fi
fi
export DEBIAN_FRONTEND=noninteractive
# apt's lists may be missing or old on a fresh machine: update once, then install. Another apt
# (unattended upgrades on a newcomer's machine) may hold the dpkg lock: wait for it, bounded
# (GRISTMILL_APT_LOCK_WAIT_S, default 600 s), rather than fail at once (apt >= 1.9.11).
WAIT="${GRISTMILL_APT_LOCK_WAIT_S:-600}"
$SUDO apt-get -o DPkg::Lock::Timeout="$WAIT" update -q >/dev/null
$SUDO apt-get -o DPkg::Lock::Timeout="$WAIT" install -y -q --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
have chromium && have chromedriver
