# Opening folders for traversal (o+x) for one run, and giving them back their modes afterwards.
# Sourced by .ci/run: open_for_traversal PATH... opens PATH and every folder above it that others
# cannot traverse, and remembers them; restore_folder_modes closes exactly those again.

OPENED_FOR_TRAVERSAL=()

open_for_traversal() {
  local path mode
  for path in "$@"; do
    while [ "$path" != "/" ]; do
      mode=$(stat -c %a "$path")
      if (( (8#$mode & 1) == 0 )); then
        chmod o+x "$path"
        OPENED_FOR_TRAVERSAL+=("$path")
      fi
      path=$(dirname "$path")
    done
  done
}

restore_folder_modes() {
  local path
  for path in "${OPENED_FOR_TRAVERSAL[@]}"; do
    chmod o-x "$path" 2>/dev/null || true
  done
  OPENED_FOR_TRAVERSAL=()
}
