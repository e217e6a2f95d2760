#!/bin/sh
# Installs pymesos 0.3.15 (the Mesos v1 HTTP API client the Mesos-compatibility tests run
# unmodified) into the venv given as $1. pymesos needs http-parser 0.9.0, whose setup.py builds a
# C extension that no longer compiles on Python 3.11; the package also ships a pure-Python
# parser, which this builds alone (run_setup(False)) into a wheel, then installs both from PyPI.
# Also mesoshttp 0.4.2, a second, independent Mesos scheduler API client (pure Python), and the
# DC/OS library dcos 0.6.1, whose dcos.mesos reads a master's state. dcos goes in without its
# dependencies: their pins (jsonschema<3, PyJWT==1.4.2, ...) serve its command line, and what
# dcos.mesos imports is six, requests, toml and jsonschema 2.
set -eu
venv=${1:?usage: install_pymesos.sh VENV}
install_dcos() {
    if ! "$venv/bin/pip" show --quiet dcos >/dev/null 2>&1; then
        "$venv/bin/pip" install --quiet --no-deps 'dcos==0.6.1' 'jsonschema==2.6.0' \
            'toml==0.10.2' 'six>=1.9'
    fi
}
if "$venv/bin/python" -c 'import pymesos, http_parser, mesoshttp' 2>/dev/null; then
    install_dcos
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$venv/bin/pip" download --quiet --no-deps --no-binary :all: 'http-parser==0.9.0' -d "$work"
tar xzf "$work/http-parser-0.9.0.tar.gz" -C "$work"
src="$work/http-parser-0.9.0"
sed -i 's/run_setup(not IS_PYPY)/run_setup(False)/' "$src/setup.py"
grep -q 'run_setup(False)' "$src/setup.py"
find "$src" -name '*.so' -delete
"$venv/bin/pip" wheel --quiet --no-deps "$src" -w "$work/wheels"
"$venv/bin/pip" install --quiet --find-links "$work/wheels" 'http-parser==0.9.0' 'pymesos==0.3.15' \
    'mesoshttp==0.4.2'
install_dcos
"$venv/bin/python" -c 'import pymesos, http_parser.pyparser, mesoshttp.client'
