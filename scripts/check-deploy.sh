#!/usr/bin/env bash
# Checks the deployment files without a Docker engine (there is none on the
# project's machines), exiting non-zero if any check fails:
#
#   docker-compose.yml  against the Compose Specification's JSON schema (the
#                       copy check-jsonschema ships, so offline), plus what a
#                       schema cannot see: depends_on names a service, named
#                       volumes are declared, bind-mount sources exist
#   deploy/prometheus   promtool check config (Debian's `prometheus` package)
#   deploy/grafana      the dashboard is JSON, every panel uses the datasource
#                       uid the provisioning declares, every metric it names is
#                       in docs/metrics.md, every query parses as PromQL
#                       (promtool check rules); the provisioning YAML parses
#
# Installs check-jsonschema into a venv under $GRAPHSINK_CACHE and promtool
# with apt-get, each once, when missing.
#
#   bash scripts/check-deploy.sh
#   bash scripts/check-deploy.sh --install   only the installs (scripts/test.sh
#                                            runs them during its build)
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHECK_JSONSCHEMA_VERSION=0.39.0
DEPLOY_VENV="$GRAPHSINK_CACHE/deploy-check-venv"
COMPOSE="docker-compose.yml"
PROM_CONFIG="deploy/prometheus/prometheus.yml"
DASHBOARD="deploy/grafana/dashboards/graphsink.json"
DATASOURCES="deploy/grafana/provisioning/datasources/prometheus.yml"
DASHBOARD_PROVIDERS="deploy/grafana/provisioning/dashboards/graphsink.yml"
METRICS_SPEC="docs/metrics.md"

ensure_check_jsonschema() {
    CHECK_JSONSCHEMA="$DEPLOY_VENV/bin/check-jsonschema"
    if [ ! -x "$CHECK_JSONSCHEMA" ] ||
        [ "$("$CHECK_JSONSCHEMA" --version 2>/dev/null)" != "check-jsonschema, version $CHECK_JSONSCHEMA_VERSION" ]; then
        log "installing check-jsonschema $CHECK_JSONSCHEMA_VERSION into $DEPLOY_VENV"
        mkdir -p "$GRAPHSINK_CACHE"
        ensure_python_venv
        # shellcheck disable=SC2016  # $1.. expand in the inner shell
        flock "$GRAPHSINK_CACHE/deploy-check-install.lock" bash -c '
            [ "$("$1/bin/check-jsonschema" --version 2>/dev/null)" = "check-jsonschema, version $2" ] && exit 0
            rm -rf "$1" && python3 -m venv "$1" &&
                "$1/bin/pip" install -q --disable-pip-version-check "check-jsonschema==$2" </dev/null
        ' _ "$DEPLOY_VENV" "$CHECK_JSONSCHEMA_VERSION"
        [ -x "$CHECK_JSONSCHEMA" ] || die "check-jsonschema install finished but $CHECK_JSONSCHEMA is missing"
    fi
    DEPLOY_PYTHON="$DEPLOY_VENV/bin/python"   # has ruamel.yaml (a check-jsonschema dependency)
}

ensure_promtool() {
    if ! have promtool; then
        have apt-get || die "promtool not found and no apt-get: install Prometheus's promtool yourself"
        log "installing promtool (Debian package prometheus) with apt-get"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus </dev/null
        have promtool || die "apt-get installed prometheus but promtool is missing"
    fi
}

FAILED=()
# check NAME CMD...: runs one check, records a failure and goes on.
check() {
    local name="$1"; shift
    log "check: $name"
    if "$@"; then
        log "ok: $name"
    else
        log "FAILED: $name"
        FAILED+=("$name")
    fi
}

# What the compose schema cannot see.
compose_references() {
    "$DEPLOY_PYTHON" - "$COMPOSE" <<'PY'
import os, sys
from ruamel.yaml import YAML
path = sys.argv[1]
doc = YAML(typ="safe").load(open(path))
services = doc.get("services") or {}
volumes = doc.get("volumes") or {}
errors = []
for name, svc in services.items():
    deps = svc.get("depends_on") or []
    for dep in (deps if isinstance(deps, list) else deps.keys()):
        if dep not in services:
            errors.append(f"{name}: depends_on names no service: {dep}")
    for vol in svc.get("volumes") or []:
        source = vol.split(":", 1)[0] if isinstance(vol, str) else vol.get("source", "")
        if source.startswith((".", "/")):
            if not os.path.exists(os.path.join(os.path.dirname(path) or ".", source)):
                errors.append(f"{name}: bind-mount source does not exist: {source}")
        elif source and source not in volumes:
            errors.append(f"{name}: named volume not declared under volumes: {source}")
for e in errors:
    print(f"{path}: {e}", file=sys.stderr)
print(f"{path}: {len(services)} services, references checked")
sys.exit(1 if errors else 0)
PY
}

# The dashboard against the provisioning and docs/metrics.md; writes its
# queries as recording rules to $1 for promtool.
dashboard_contents() {
    "$DEPLOY_PYTHON" - "$DASHBOARD" "$DATASOURCES" "$DASHBOARD_PROVIDERS" "$METRICS_SPEC" "$1" <<'PY'
import json, re, sys
from ruamel.yaml import YAML
dash_path, ds_path, prov_path, spec_path, rules_path = sys.argv[1:]
errors = []
try:
    dash = json.load(open(dash_path))
except ValueError as e:
    sys.exit(f"{dash_path}: not JSON: {e}")
yaml = YAML(typ="safe")
ds = yaml.load(open(ds_path))
prov = yaml.load(open(prov_path))
uids = {d.get("uid") for d in ds.get("datasources", [])}
if not any(p.get("type") == "file" and p.get("options", {}).get("path") for p in prov.get("providers", [])):
    errors.append(f"{prov_path}: no file provider with options.path")
spec = set(re.findall(r"^\| `(graphsink_[a-z0-9_]+)` \|", open(spec_path).read(), re.M))
if not spec:
    errors.append(f"{spec_path}: no metric table found")

def panels(ps):
    for p in ps:
        yield p
        yield from panels(p.get("panels", []))

exprs, ids, shown = [], set(), 0
for p in panels(dash.get("panels", [])):
    title = p.get("title", "?")
    if p.get("id") in ids:
        errors.append(f"panel {title!r}: duplicate id {p.get('id')}")
    ids.add(p.get("id"))
    if p.get("type") == "row":
        continue
    shown += 1
    for t in p.get("targets", []):
        for where in (p, t):
            uid = (where.get("datasource") or {}).get("uid")
            if uid not in uids:
                errors.append(f"panel {title!r}: datasource uid {uid!r} is not provisioned ({sorted(uids)})")
        expr = t.get("expr", "")
        exprs.append(expr)
        for name in re.findall(r"\bgraphsink_[a-z0-9_]+", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if name not in spec and base not in spec:
                errors.append(f"panel {title!r}: {name} is not in {spec_path}")
if not exprs:
    errors.append(f"{dash_path}: no queries")
rules = {"groups": [{"name": "dashboard", "rules": [
    {"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)]}]}
json.dump(rules, open(rules_path, "w"), indent=1)   # JSON is YAML
for e in errors:
    print(f"{dash_path}: {e}", file=sys.stderr)
print(f"{dash_path}: schemaVersion {dash.get('schemaVersion')}, {shown} panels, "
      f"{len(exprs)} queries, metric names checked against {spec_path}")
sys.exit(1 if errors else 0)
PY
}

main() {
    cd "$GRAPHSINK_REPO"
    ensure_check_jsonschema
    ensure_promtool
    [ "${1:-}" = --install ] && return 0
    local tmp
    tmp="$(mktemp -d "${TMPDIR:-/tmp}/graphsink-check-deploy.XXXXXX")"
    # shellcheck disable=SC2064  # expand $tmp now
    trap "rm -rf '$tmp'" EXIT

    check "compose schema ($COMPOSE)" "$CHECK_JSONSCHEMA" --builtin-schema vendor.compose-spec "$COMPOSE"
    check "compose references ($COMPOSE)" compose_references
    check "prometheus config ($PROM_CONFIG)" promtool check config "$PROM_CONFIG"
    check "grafana dashboard ($DASHBOARD)" dashboard_contents "$tmp/dashboard-rules.yml"
    if [ -s "$tmp/dashboard-rules.yml" ]; then
        check "dashboard queries parse as PromQL" promtool check rules "$tmp/dashboard-rules.yml"
    else
        log "FAILED: dashboard queries were not extracted"
        FAILED+=("dashboard queries")
    fi

    if [ "${#FAILED[@]}" -gt 0 ]; then
        die "${#FAILED[@]} deploy check(s) failed: ${FAILED[*]}"
    fi
    log "all deploy checks passed"
}

main "$@"
