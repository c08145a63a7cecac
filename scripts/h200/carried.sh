# Sourced by the device scripts that take files from the carried bundle (.device/):
# carried PATH: the carried bundle PATH, at the root or two levels up from a .dev/NAME copy.
carried() {
    for up in "" ../../; do
        [ -d "$up$1" ] && { echo "$up$1"; return 0; }
    done
    echo "no $1 here or in ../.." >&2
    return 1
}
