# Shared by the launchers: --dry_run handling and command printing. Source it; do not run it.
#
# After `parse_common "$@"; set -- "${ARGS[@]}"`:
#   DRY_RUN=1 when --dry_run was given (the flag is removed from the arguments);
#   run CMD...     runs CMD, or with --dry_run prints it shell-quoted (one line, exactly what would run);
#   run_sh STRING  the same for a shell pipeline given as one string (printed verbatim);
#   setenv N=V     exports N, printed as `export N=V` under --dry_run.
# MODULE (default animegamer_jax.commands.train) is the Python module every process runs; e.g.
# MODULE=animegamer_jax.commands.check runs the multi-host smoke test instead of training.
DRY_RUN=0
MODULE=${MODULE:-animegamer_jax.commands.train}
ARGS=()
parse_common() {
  local a
  for a in "$@"; do
    if [[ "$a" == "--dry_run" ]]; then DRY_RUN=1; else ARGS+=("$a"); fi
  done
}
# POSIX-shell quoting, readable: bare when safe, else '...' (embedded ' as '\'')
quote1() {
  if [[ "$1" =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then printf '%s' "$1"
  else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}
quote() { local out="" a; for a in "$@"; do out+=" $(quote1 "$a")"; done; printf '%s' "${out# }"; }
run() { if [[ $DRY_RUN == 1 ]]; then quote "$@"; echo; else "$@"; fi; }
run_sh() { if [[ $DRY_RUN == 1 ]]; then printf '%s\n' "$1"; else bash -c "set -euo pipefail; $1"; fi; }
setenv() {
  local name=${1%%=*} value=${1#*=}
  export "$name=$value"
  if [[ $DRY_RUN == 1 ]]; then echo "export $name=$(quote1 "$value")"; fi
}
