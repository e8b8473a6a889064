# Sourced by the benchmarks: the repository root as working folder, a built mltrain in $M, and a
# scratch folder $D removed on exit.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
[ -x build/apps/mltrain/mltrain ] || bash scripts/build.sh >/dev/null
M=build/apps/mltrain/mltrain
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
