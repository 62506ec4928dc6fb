#!/bin/sh
# The virtual environment `make` works in, made by a Python the lock is for (3.11 or 3.12), or one line saying
# what to install. A .venv another Python made (a python3 of 3.9, 3.10, 3.13 ...) is made again, not kept.
#
#   sh workshop/venv.sh [VENV [PYTHON]]     VENV: .venv; PYTHON: the interpreter to use (default: searched)
#
# Searched in this order: python3.11, python3.12, python3. It prints nothing when .venv is fine already.
set -eu

SUPPORTED="3.11 3.12"  # = workshop.lock.PYTHONS
venv=${1:-.venv}
chosen=${2:-}

version_of() {  # "3.11", or nothing where $1 is not a working Python
    "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}

supported() {
    for v in $SUPPORTED; do [ "$1" = "$v" ] && return 0; done
    return 1
}

refuse() {
    echo "error: $1. Install Python 3.11 or 3.12 - macOS: brew install python@3.11; Ubuntu 22.04 (WSL too): sudo apt install python3.11 python3.11-venv; Ubuntu 24.04 (WSL too): sudo apt install python3.12-venv - then run make again, or name one: make install PYTHON=/path/to/python3.11" >&2
    exit 1
}

if [ -e "$venv" ]; then
    have=$(version_of "$venv/bin/python")
    if supported "$have" && [ -f "$venv/pyvenv.cfg" ] && "$venv/bin/python" -c 'import pip' 2>/dev/null; then
        exit 0
    fi
    if supported "$have"; then
        echo "$venv is incomplete (its making was interrupted): making it again."
    else
        made_by="a Python that no longer runs"
        [ -n "$have" ] && made_by="Python $have"
        echo "$venv was made by $made_by, which this project does not support: making it again."
    fi
    rm -rf "$venv"
fi

if [ -n "$chosen" ]; then
    have=$(version_of "$chosen")
    is="not a Python that runs"
    [ -n "$have" ] && is="Python $have"
    supported "$have" || refuse "PYTHON=$chosen is $is"
else
    for candidate in python3.11 python3.12 python3; do
        if command -v "$candidate" >/dev/null 2>&1 && supported "$(version_of "$candidate")"; then
            chosen=$(command -v "$candidate")
            break
        fi
    done
    if [ -z "$chosen" ]; then
        found=$(version_of python3)
        refuse "no Python 3.11 or 3.12 here (python3 is ${found:-missing})"
    fi
fi

# Ubuntu's Python has no ensurepip without its venv package: venv would fail after making half a folder.
if ! "$chosen" -c 'import ensurepip, venv' 2>/dev/null; then
    v=$(version_of "$chosen")
    echo "error: $chosen (Python $v) cannot make a virtual environment: its venv package is missing. On Ubuntu and WSL: sudo apt install python$v-venv, then run make again" >&2
    exit 1
fi
echo "Making $venv with $chosen (Python $(version_of "$chosen"))."
"$chosen" -m venv "$venv"
