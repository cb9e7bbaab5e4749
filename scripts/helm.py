"""`helm lint`, `helm template` and `helm version`, offline, on Helm's own Go code.

No registry this project can reach ships the `helm` binary (not Debian, PyPI or npm under
that name). The PyPI package helm-python-sdk ships Helm v4's Go SDK compiled as a shared
library (libhelm_c.so) with a ctypes API: its chart loader, values coalescing, template
engine and linter are Helm's. This file is the command line over it that tests/deploy.rs
runs: `scripts/ensure-servers.sh --deploy-tools` installs it as `bin/helm` in the deploy
tools' virtualenv, beside the pinned helm-python-sdk.

What it adds to the library, as the helm binary does: the values from -f files and the
--set family merged in Helm's order (files, then --set-json, --set, --set-string,
--set-literal), each rendered file split into documents with a `# Source:` line, and the
documents printed in Helm's install order (hooks last); `lint --strict` fails on warnings.
Not supported: --set-file, subcharts' own values files, .Capabilities set from a cluster.
"""

import argparse
import json
import re
import sys

import helm_python as helm
import yaml

# Helm's InstallOrder (pkg/release/util/kind_sorter.go): kinds not listed come after these.
INSTALL_ORDER = """PriorityClass Namespace NetworkPolicy ResourceQuota LimitRange PodSecurityPolicy
    PodDisruptionBudget ServiceAccount Secret SecretList ConfigMap StorageClass PersistentVolume
    PersistentVolumeClaim CustomResourceDefinition ClusterRole ClusterRoleList ClusterRoleBinding
    ClusterRoleBindingList Role RoleList RoleBinding RoleBindingList Service DaemonSet Pod
    ReplicationController ReplicaSet Deployment HorizontalPodAutoscaler StatefulSet Job CronJob
    IngressClass Ingress APIService MutatingWebhookConfiguration
    ValidatingWebhookConfiguration""".split()

# How Helm splits a rendered file into documents (releaseutil.SplitManifests).
DOCUMENT_SEPARATOR = re.compile(r"(?:^|\s*\n)---\s*")


def merge(base, override):
    """Helm's mergeMaps: maps merge key by key, anything else is replaced."""
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = value
    return base


def user_values(args):
    values = {}
    for path in args.values:
        with open(path, encoding="utf-8") as f:
            merge(values, helm.values_from_yaml(f.read()))
    for flag, parse in (
        ("set_json", helm.parse_set_json),
        ("set", helm.parse_set_string),
        ("set_string", helm.parse_set_string_values),
        ("set_literal", helm.parse_set_literal),
    ):
        for expression in getattr(args, flag):
            merge(values, parse(expression))
    return values


def lint(args):
    values = user_values(args)
    report = helm.lint(
        args.chart,
        values or None,
        strict=args.strict,
        namespace=args.namespace,
        kube_version=args.kube_version,
    )
    names = {1: "INFO", 2: "WARNING", 3: "ERROR"}
    print(f"==> Linting {args.chart}")
    worst = 0
    for m in report["messages"]:
        worst = max(worst, m["severity"])
        print(f"[{names.get(m['severity'], 'UNKNOWN')}] {m['path']}: {m['error']}")
    failed = worst >= 3 or bool(report["errors"]) or (args.strict and worst >= 2)
    print()
    summary = f"1 chart(s) linted, {int(failed)} chart(s) failed"
    if failed:
        print(f"Error: {summary}", file=sys.stderr)
        return 1
    print(summary)
    return 0


def template(args):
    chart = helm.Chart.load(args.chart)
    rendered = chart.render(
        user_values(args) or None,
        name=args.name,
        namespace=args.namespace,
        is_install=True,
    )
    documents = []
    for path in sorted(rendered):
        if path.endswith("NOTES.txt"):
            continue
        for text in DOCUMENT_SEPARATOR.split(rendered[path]):
            text = text.strip()
            if not text:
                continue
            try:
                head = yaml.safe_load(text) or {}
            except yaml.YAMLError as e:
                print(f"Error: YAML parse error on {path}: {e}", file=sys.stderr)
                return 1
            if not isinstance(head, dict):
                head = {}
            kind = str(head.get("kind", ""))
            hook = "helm.sh/hook" in ((head.get("metadata") or {}).get("annotations") or {})
            # Hooks last; known kinds in install order, then the others by kind.
            known = kind in INSTALL_ORDER
            rank = INSTALL_ORDER.index(kind) if known else len(INSTALL_ORDER)
            order = (hook, rank, "" if known else kind)
            documents.append((order, path, text))
    if args.show_only:
        documents = [d for d in documents if any(d[1].endswith(s) for s in args.show_only)]
        if not documents:
            print(f"Error: could not find template {args.show_only} in chart", file=sys.stderr)
            return 1
    # Stable: documents of one kind keep the order of their files.
    documents.sort(key=lambda d: d[0])
    for _, path, text in documents:
        sys.stdout.write(f"---\n# Source: {path}\n{text}\n")
    return 0


def version(_args):
    print(
        f'version.BuildInfo{{Version:"{helm.helm_sdk_version()}", '
        f'SDK:"helm-python-sdk {helm.__version__}"}}'
    )
    return 0


def main():
    parser = argparse.ArgumentParser(prog="helm", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("version").set_defaults(run=version)
    for name, run in (("lint", lint), ("template", template)):
        p = commands.add_parser(name)
        p.set_defaults(run=run)
        if name == "template":
            # `helm template [NAME] CHART`
            p.add_argument("args", nargs="+", metavar="[NAME] CHART")
            p.add_argument("--show-only", "-s", action="append", default=[])
        else:
            p.add_argument("chart")
            p.add_argument("--strict", action="store_true")
            p.add_argument("--kube-version")
        p.add_argument("--namespace", "-n")
        p.add_argument("--values", "-f", action="append", default=[])
        for flag in ("--set", "--set-json", "--set-string", "--set-literal"):
            p.add_argument(flag, action="append", default=[])
    args = parser.parse_args()
    if args.command == "template":
        if len(args.args) > 2:
            parser.error("template takes [NAME] CHART")
        args.name, args.chart = (["release-name"] + args.args)[-2:]
    try:
        return args.run(args)
    except helm.HelmError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
