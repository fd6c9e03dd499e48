# Sourced by the scripts of this directory, from it: $root is the
# repository, $tmp a directory of their own, and pids the processes they
# start in the background. On exit, those processes are stopped and $tmp
# goes.
root=$(cd ../.. && pwd)
tmp=$(mktemp -d)
pids=()
cleanup() {
	for pid in "${pids[@]}"; do
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	rm -rf "$tmp"
}
trap cleanup EXIT
