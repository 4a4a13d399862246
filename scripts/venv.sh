# Sourced by run.sh and test.sh: makes sure .venv exists and holds this project with the given extra.
# Re-installs only when pyproject.toml changes, so repeated runs start in seconds.
# Usage: source scripts/venv.sh EXTRA   (EXTRA is "" for the runtime only, "test" for the test tools)
extra="${1:-}"
VENV="${RECTRAIN_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating virtual environment $VENV" >&2
  "${PYTHON:-python3}" -m venv "$VENV"
fi
stamp="$VENV/.installed-$(sha256sum pyproject.toml | cut -c1-16)-${extra:-base}"
if [ ! -f "$stamp" ]; then
  echo "installing rectrain${extra:+[$extra]} into $VENV (first run takes a few minutes)" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".${extra:+[$extra]}"
  touch "$stamp"
fi
case "$VENV" in
  /*) export PATH="$VENV/bin:$PATH" ;;
  *) export PATH="$PWD/$VENV/bin:$PATH" ;;
esac
# gRPC stubs from protos/ (git-ignored; regenerated when a .proto is newer than its stubs)
"$VENV/bin/python" -m recserve.server.transports.protogen --check || "$VENV/bin/python" -m recserve.server.transports.protogen >/dev/null
