#!/usr/bin/env bash
# Install what the browser tests and the offline HTML report need. Idempotent: safe to run again.
#   install_browser.sh [VENV] [--widgets-only]: --widgets-only installs step 3 alone (all `make run` needs)
#   1. Debian's chromium (Playwright drives it through executable_path; we never run
#      `playwright install`, which downloads its own browser build)
#   2. the Python `playwright` package, into the venv given as $1 (default .venv)
#   3. the jupyter-widgets HTML manager and require.js from npm, into vendor/node_modules
#      (git-ignored by vendor/.gitignore), so report HTML renders widgets with no network
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
WIDGETS_ONLY=0
[ "${2:-}" = "--widgets-only" ] && WIDGETS_ONLY=1
APT_UPDATED=0
apt_install() {  # apt-get update at most once a run, then install
    if [ "$(id -u)" -ne 0 ]; then
        echo "install_browser.sh: $* missing; run this script as root (or: sudo apt-get install -y $*)" >&2
        exit 1
    fi
    if [ "$APT_UPDATED" = 0 ]; then apt-get update; APT_UPDATED=1; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
}

if [ "$WIDGETS_ONLY" = 0 ] && [ ! -x /usr/bin/chromium ]; then
    apt_install chromium fonts-dejavu-core
fi

if [ "$WIDGETS_ONLY" = 0 ] && ! "$VENV/bin/python" -c "import playwright.sync_api" 2>/dev/null; then
    "$VENV/bin/python" -m pip install --quiet playwright
fi

# reinstall when the lock file changed since the last install (the stamp holds its checksum)
LOCK_SUM="$(sha256sum vendor/package-lock.json | cut -d' ' -f1)"
if [ ! -f vendor/node_modules/@jupyter-widgets/html-manager/dist/embed-amd.js ] \
   || [ ! -f vendor/node_modules/requirejs/require.js ] \
   || [ "$(cat vendor/node_modules/.mtplab-lock 2>/dev/null)" != "$LOCK_SUM" ]; then
    if ! command -v npm >/dev/null; then
        apt_install nodejs npm
    fi
    # package-lock.json pins the exact versions; `npm ci` installs exactly those
    (cd vendor && npm ci --no-audit --no-fund --ignore-scripts)
    echo "$LOCK_SUM" > vendor/node_modules/.mtplab-lock
fi
if [ "$WIDGETS_ONLY" = 1 ]; then
    echo "install_browser.sh: widget manager ready"
else
    echo "install_browser.sh: chromium $(/usr/bin/chromium --version 2>/dev/null | awk '{print $2}'), playwright, widget manager ready"
fi
