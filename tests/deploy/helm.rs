//! The Helm chart (`deploy/helm/jobwarden`), checked offline like `k8s/`: `helm lint
//! --strict`, `helm template` of the default values and of each example values file
//! (`ci/*-values.yaml`: classic sidecar, NACK, KEDA, queues of one's own) validated against
//! Kubernetes 1.29 and 1.33 and linted, every rendering held to the rules the kustomize
//! tests hold k8s/ to (the same check functions), and its ConfigMap through `jobwarden
//! config check` with each pod's environment.
//!
//! Two renderings are compared with kustomize's, object by object: the default values with
//! `kubectl kustomize k8s/base` (every object, the ConfigMap's TOML value by value), and
//! `ci/classic-values.yaml` with k8s/overlays/classic-sidecar's StatefulSet. What Helm adds
//! and kustomize has no equivalent for — its labels, the pod template's config checksum —
//! is named in [`HELM_ONLY`] and left out; nothing else is.
//!
//! `helm` is the pinned deploy tool (Helm v4's SDK from helm-python-sdk behind
//! scripts/helm.py, installed by `scripts/ensure-servers.sh --deploy-tools`).

use super::*;

const CHART: &str = "deploy/helm/jobwarden";
/// The release whose objects are named as k8s/base's (`jobwarden`, `jobwarden-migrate`).
const RELEASE: &str = "jobwarden";
/// The example values files (`ci/<name>-values.yaml`) the tests below rely on; any other
/// file there is rendered, linted and validated too.
const CI_VALUES: [&str; 4] = ["classic", "nack", "keda", "queues"];
/// Label and annotation keys Helm's objects carry and kustomize's do not: the release's
/// instance (in selectors too, so two releases in a namespace stay apart), chart and app
/// versions, the manager, and the checksum that rolls the pods on a configuration change.
/// Only label and annotation keys contain a `/`, so they are removed wherever they occur.
const HELM_ONLY: [&str; 5] = [
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
    "checksum/config",
];
/// The fields of KEDA's v1alpha1 ScaledObject spec, its triggers, and the nats-jetstream
/// scaler's metadata (KEDA's documentation), so a misspelt one is caught although
/// kubernetes-validate has no schema for the kind.
const KEDA_SPEC_FIELDS: &str = "scaleTargetRef pollingInterval cooldownPeriod \
    initialCooldownPeriod idleReplicaCount minReplicaCount maxReplicaCount fallback advanced \
    triggers";
const KEDA_TRIGGER_FIELDS: &str = "type name metadata authenticationRef metricType \
    useCachedMetrics";
const NATS_JETSTREAM_METADATA: &str = "natsServerMonitoringEndpoint account stream consumer \
    lagThreshold activationLagThreshold useHttps";

fn chart_dir() -> PathBuf {
    repo().join(CHART)
}

/// The values files under ci/, sorted: (`ci/<file>`, path).
fn ci_values() -> Vec<(String, PathBuf)> {
    let mut files: Vec<(String, PathBuf)> = std::fs::read_dir(chart_dir().join("ci"))
        .expect("deploy/helm/jobwarden/ci")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| {
            (
                format!("ci/{}", p.file_name().unwrap().to_str().unwrap()),
                p,
            )
        })
        .collect();
    files.sort();
    for name in CI_VALUES {
        assert!(
            files
                .iter()
                .any(|(f, _)| *f == format!("ci/{name}-values.yaml")),
            "{CHART}/ci/{name}-values.yaml is missing"
        );
    }
    files
}

/// `helm template jobwarden <chart>` with `args`; panics with its output when it fails.
fn helm_template(helm: &Path, args: &[&str]) -> String {
    let mut all = vec!["template", RELEASE, CHART];
    all.extend_from_slice(args);
    let out = run(helm, &all, None);
    assert!(
        out.status.success(),
        "helm {} failed:\n{}",
        all.join(" "),
        text(&out)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The chart rendered with its default values, then with each ci/ values file (once per
/// test binary).
fn charted(helm: &Path) -> &'static [Rendered] {
    static RENDERED: OnceLock<Vec<Rendered>> = OnceLock::new();
    RENDERED.get_or_init(|| {
        let mut runs = vec![("helm template".to_string(), vec![])];
        for (name, path) in ci_values() {
            runs.push((
                format!("helm template -f {name}"),
                vec!["-f".to_string(), path.to_str().unwrap().to_string()],
            ));
        }
        runs.into_iter()
            .map(|(dir, args)| {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let yaml = helm_template(helm, &args);
                let docs = yaml_to_json(&yaml, &dir);
                assert!(!docs.is_empty(), "{dir} rendered nothing");
                Rendered { dir, yaml, docs }
            })
            .collect()
    })
}

/// One rendering of [`charted`]: the defaults (`None`) or ci/<name>-values.yaml.
fn chart(helm: &Path, values: Option<&str>) -> &'static Rendered {
    let dir = match values {
        None => "helm template".to_string(),
        Some(name) => format!("helm template -f ci/{name}-values.yaml"),
    };
    charted(helm)
        .iter()
        .find(|r| r.dir == dir)
        .unwrap_or_else(|| panic!("no rendering {dir}"))
}

/// `doc` without what [`HELM_ONLY`] names, without metadata.namespace (kustomize's overlays
/// set one, `helm template` leaves it to the install), with annotations left empty removed,
/// and with every string in `renames` replaced (kustomize's hashed ConfigMap name).
fn normalized(doc: &Value, renames: &BTreeMap<String, String>) -> Value {
    fn walk(v: &Value, renames: &BTreeMap<String, String>) -> Value {
        match v {
            Value::Object(map) => Value::Object(
                map.iter()
                    .filter(|(k, _)| !HELM_ONLY.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), walk(v, renames)))
                    .filter(|(k, v)| {
                        !(k == "annotations" && v.as_object().is_some_and(|m| m.is_empty()))
                    })
                    .collect(),
            ),
            Value::Array(items) => items.iter().map(|i| walk(i, renames)).collect(),
            Value::String(s) => Value::from(renames.get(s).unwrap_or(s).as_str()),
            other => other.clone(),
        }
    }
    let mut out = walk(doc, renames);
    if let Some(meta) = out["metadata"].as_object_mut() {
        meta.remove("namespace");
    }
    out
}

/// Where `a` (kustomize's) and `b` (the chart's) differ, one line per difference, each
/// naming its path.
fn json_diff(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let p = format!("{path}.{k}");
                match (x.get(k), y.get(k)) {
                    (Some(v), Some(w)) => json_diff(&p, v, w, out),
                    (Some(v), None) => out.push(format!("{p}: only in kustomize's: {v}")),
                    (None, Some(w)) => out.push(format!("{p}: only in the chart's: {w}")),
                    (None, None) => unreachable!(),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                json_diff(&format!("{path}[{i}]"), v, w, out);
            }
        }
        _ if a != b => out.push(format!("{path}: kustomize's {a}\n    the chart's {b}")),
        _ => {}
    }
}

/// (kind, name) of a document.
fn key(doc: &Value) -> (String, String) {
    (
        doc["kind"].as_str().unwrap_or_default().to_string(),
        doc["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

/// Kustomize's ConfigMap name mapped to the chart's (kustomize adds a hash of the content;
/// the chart rolls the pods with a checksum annotation instead).
fn configmap_renames(kustomized: &Rendered, charted: &Rendered) -> BTreeMap<String, String> {
    let name = |r: &Rendered| {
        config_map(r).0["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_string()
    };
    BTreeMap::from([(name(kustomized), name(charted))])
}

/// The differences between two TOML files' values, or none.
fn toml_diff(a: &str, b: &str) -> Vec<String> {
    let parse = |t: &str| -> Value {
        serde_json::to_value(toml::from_str::<toml::Value>(t).expect("TOML")).unwrap()
    };
    let mut out = Vec::new();
    json_diff(CONFIG_KEY, &parse(a), &parse(b), &mut out);
    out
}

// ---------------------------------------------------------------------------------------
// Lint
// ---------------------------------------------------------------------------------------

#[test]
fn helm_lint_strict_passes_with_the_default_and_every_example_values_file() {
    let Some([helm]) = tools(["helm"]) else {
        return;
    };
    let mut runs: Vec<Vec<String>> = vec![vec![]];
    for (_, path) in ci_values() {
        runs.push(vec!["-f".into(), path.to_str().unwrap().into()]);
    }
    for values in runs {
        for kube in KUBERNETES_VERSIONS {
            let mut args = vec!["lint", "--strict", "--kube-version", kube, CHART];
            args.extend(values.iter().map(String::as_str));
            let out = run(&helm, &args, None);
            assert!(
                out.status.success(),
                "helm {}:\n{}",
                args.join(" "),
                text(&out)
            );
        }
    }
}

#[test]
fn helm_chart_files_and_every_rendering_pass_yamllint() {
    let Some([helm, yamllint]) = tools(["helm", "yamllint"]) else {
        return;
    };
    let files = [
        format!("{CHART}/Chart.yaml"),
        format!("{CHART}/values.yaml"),
        format!("{CHART}/ci/"),
    ];
    let mut args = vec!["--strict", "-c", ".yamllint"];
    args.extend(files.iter().map(String::as_str));
    let out = run(&yamllint, &args, None);
    assert!(
        out.status.success(),
        "yamllint {}:\n{}",
        args.join(" "),
        text(&out)
    );
    for r in charted(&helm) {
        let out = run(
            &yamllint,
            &["--strict", "-c", ".yamllint", "-"],
            Some(&r.yaml),
        );
        assert!(
            out.status.success(),
            "{} | yamllint --strict -c .yamllint -:\n{}",
            r.dir,
            text(&out)
        );
    }
}

#[test]
fn helm_template_refuses_a_sidecar_mode_or_ops_listen_it_cannot_deploy() {
    let Some([helm]) = tools(["helm"]) else {
        return;
    };
    for (set, says) in [
        (
            "sidecar.mode=sidecarless",
            "sidecar.mode must be native or classic",
        ),
        (
            "config.worker.ops_listen=off",
            "config.worker.ops_listen must be",
        ),
    ] {
        let out = run(&helm, &["template", RELEASE, CHART, "--set", set], None);
        assert!(
            !out.status.success() && text(&out).contains(says),
            "helm template --set {set} should fail saying {says:?}:\n{}",
            text(&out)
        );
    }
}

// ---------------------------------------------------------------------------------------
// The same objects as kustomize's
// ---------------------------------------------------------------------------------------

#[test]
fn helm_template_of_the_default_values_renders_the_objects_of_k8s_base() {
    let Some([kubectl, helm]) = tools(["kubectl", "helm"]) else {
        return;
    };
    let base = render(&kubectl, "k8s/base");
    let default = chart(&helm, None);
    let renames = configmap_renames(base, default);
    let objects = |r: &Rendered, renames: &BTreeMap<String, String>| {
        r.docs
            .iter()
            .filter(|d| d["kind"] != "ConfigMap")
            .map(|d| (key(&normalized(d, renames)), normalized(d, renames)))
            .collect::<BTreeMap<_, _>>()
    };
    let theirs = objects(base, &renames);
    let ours = objects(default, &BTreeMap::new());
    assert_eq!(
        theirs.keys().collect::<Vec<_>>(),
        ours.keys().collect::<Vec<_>>(),
        "the chart's objects (right) are not k8s/base's (left)"
    );
    let mut diffs = Vec::new();
    for ((kind, name), doc) in &theirs {
        json_diff(
            &format!("{kind}/{name}"),
            doc,
            &ours[&(kind.clone(), name.clone())],
            &mut diffs,
        );
    }
    // The configuration: the same values (the chart writes its own TOML, without comments).
    diffs.extend(toml_diff(&config_map(base).1, &config_map(default).1));
    assert!(
        diffs.is_empty(),
        "helm template {RELEASE} {CHART} differs from kubectl kustomize k8s/base \
         (besides {HELM_ONLY:?}):\n{}",
        diffs.join("\n")
    );
    // The comparison saw the objects that matter.
    for kind in [
        "StatefulSet",
        "Service",
        "PodDisruptionBudget",
        "Job",
        "ConfigMap",
    ] {
        assert!(default.one(kind).is_some(), "the chart renders no {kind}");
    }
}

#[test]
fn helm_classic_sidecar_renders_the_pods_of_the_classic_overlay_and_validates_against_1_27() {
    let Some([kubectl, helm, validator]) = tools(["kubectl", "helm", "kubernetes-validate"]) else {
        return;
    };
    let overlay = render(&kubectl, "k8s/overlays/classic-sidecar");
    let classic = chart(&helm, Some("classic"));
    let renames = configmap_renames(overlay, classic);
    let sts = |r: &Rendered, renames: &BTreeMap<String, String>| {
        normalized(r.one("StatefulSet").unwrap(), renames)
    };
    let mut diffs = Vec::new();
    json_diff(
        "StatefulSet",
        &sts(overlay, &renames),
        &sts(classic, &BTreeMap::new()),
        &mut diffs,
    );
    assert!(
        diffs.is_empty(),
        "{} differs from k8s/overlays/classic-sidecar:\n{}",
        classic.dir,
        diffs.join("\n")
    );
    // No trace of a native sidecar: it validates where there is none...
    let problems = validation_problems(&validator, &classic.yaml, "1.27.0");
    assert!(
        problems.is_empty(),
        "{} against 1.27:\n{}",
        classic.dir,
        problems.join("\n")
    );
    // ...where the default (native) rendering is refused.
    let native = chart(&helm, None);
    let problems = validation_problems(&validator, &native.yaml, "1.27.0");
    assert!(
        problems.iter().any(|p| p.contains("restartPolicy")),
        "{}: the native sidecar validated against 1.27: {problems:?}",
        native.dir
    );
}

#[test]
fn helm_nack_renders_k8s_nacks_stream_and_consumers() {
    let Some([kubectl, helm]) = tools(["kubectl", "helm"]) else {
        return;
    };
    let nack = render(&kubectl, "k8s/nack");
    let ours = chart(&helm, Some("nack"));
    let specs = |r: &Rendered, kind: &str| -> BTreeMap<String, Value> {
        r.of_kind(kind)
            .map(|d| {
                let id = d["spec"]["durableName"]
                    .as_str()
                    .or(d["spec"]["name"].as_str())
                    .unwrap()
                    .to_string();
                (id, d["spec"].clone())
            })
            .collect()
    };
    let mut diffs = Vec::new();
    for kind in ["Stream", "Consumer"] {
        let (theirs, mine) = (specs(nack, kind), specs(ours, kind));
        assert!(!theirs.is_empty(), "k8s/nack has no {kind}");
        json_diff(
            kind,
            &serde_json::to_value(&theirs).unwrap(),
            &serde_json::to_value(&mine).unwrap(),
            &mut diffs,
        );
    }
    assert!(
        diffs.is_empty(),
        "{}'s NACK resources differ from k8s/nack's:\n{}",
        ours.dir,
        diffs.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// Every rendering
// ---------------------------------------------------------------------------------------

#[test]
fn every_helm_rendering_validates_against_kubernetes_1_29_and_1_33() {
    let Some([helm, validator]) = tools(["helm", "kubernetes-validate"]) else {
        return;
    };
    let mut problems = Vec::new();
    for r in charted(&helm) {
        let with_schema = r.docs.iter().filter(|d| !is_crd(d)).count();
        for version in KUBERNETES_VERSIONS {
            let (found, passed) = validate(&validator, &r.yaml, version);
            for p in found {
                problems.push(format!("{} against {version}: {p}", r.dir));
            }
            if passed != with_schema {
                problems.push(format!(
                    "{} against {version}: {passed} of {with_schema} resources passed",
                    r.dir
                ));
            }
        }
        // The kinds without a schema come only with their toggles, which change the workers:
        // NACK's with provisioning turned off, KEDA's with no replica count of their own.
        let sts = r.one("StatefulSet").unwrap();
        let (sc, _) = sidecar(&sts["spec"]["template"]["spec"]).unwrap();
        let provision_off =
            env(sc, "JOBWARDEN_NATS__PROVISION").is_some_and(|e| e["value"] == "false");
        let nack = r.one("Stream").is_some() || r.of_kind("Consumer").next().is_some();
        if nack != provision_off {
            problems.push(format!(
                "{}: NACK resources {nack}, JOBWARDEN_NATS__PROVISION=false {provision_off}",
                r.dir
            ));
        }
        let keda = r.one("ScaledObject").is_some();
        if keda == sts["spec"]["replicas"].is_number() {
            problems.push(format!(
                "{}: a ScaledObject {keda}, the StatefulSet's replicas {}",
                r.dir, sts["spec"]["replicas"]
            ));
        }
    }
    assert!(
        !chart(&helm, None).docs.iter().any(is_crd),
        "the default values render NACK or KEDA resources"
    );
    assert!(
        problems.is_empty(),
        "validation problems:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_helm_rendering_keeps_the_deployment_rules() {
    let Some([helm]) = tools(["helm"]) else {
        return;
    };
    for r in charted(&helm) {
        check_workers(r);
        check_termination_grace(r);
        check_probes_and_prestop(r);
        check_restricted_containers(r);
        check_pod_secrets(r);
        if r.one("Stream").is_some() {
            check_nack(r);
        }
        if r.one("ScaledObject").is_some() {
            check_keda(r);
        }
    }
}

#[test]
fn every_helm_renderings_configmap_passes_config_check_with_each_pods_environment() {
    let Some([helm]) = tools(["helm"]) else {
        return;
    };
    for r in charted(&helm) {
        check_config_in_each_container(r);
    }
    // The custom queues made it into the file as written.
    let queues = chart(&helm, Some("queues"));
    let config = effective_config(queues);
    let names: Vec<&String> = config["queues"].as_table().unwrap().keys().collect();
    assert_eq!(
        names,
        ["pdf_render", "reports", "throttled", "webhooks"],
        "{}: the queues (email set to null must be gone)",
        queues.dir
    );
    assert_eq!(
        config["queues"]["pdf_render"]["handler"]["command"]
            .as_array()
            .map(Vec::len),
        Some(2),
        "{}",
        queues.dir
    );
}

/// The ScaledObject scales the StatefulSet on the consumers the worker uses: a trigger for
/// each queue's bare subject and, either for every queue or for none, its priority bands.
fn check_keda(r: &Rendered) {
    let so = r.one("ScaledObject").unwrap();
    let spec = &so["spec"];
    for field in spec.as_object().unwrap().keys() {
        assert!(
            KEDA_SPEC_FIELDS.split_whitespace().any(|f| f == field),
            "{}: ScaledObject spec: unknown field {field}",
            r.dir
        );
    }
    let sts = r.one("StatefulSet").unwrap();
    assert_eq!(
        spec["scaleTargetRef"],
        serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "name": sts["metadata"]["name"],
        }),
        "{}",
        r.dir
    );
    let (min, max) = (
        spec["minReplicaCount"].as_i64().unwrap(),
        spec["maxReplicaCount"].as_i64().unwrap(),
    );
    assert!(0 <= min && min <= max, "{}: replicas {min} to {max}", r.dir);

    let config = effective_config(r);
    let stream = config["nats"]["stream"].as_str().unwrap();
    let queues: Vec<String> = config["queues"]
        .as_table()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    let mut consumers = BTreeSet::new();
    let mut names = BTreeSet::new();
    for t in spec["triggers"].as_array().unwrap() {
        for field in t.as_object().unwrap().keys() {
            assert!(
                KEDA_TRIGGER_FIELDS.split_whitespace().any(|f| f == field),
                "{}: trigger: unknown field {field}",
                r.dir
            );
        }
        assert_eq!(t["type"], "nats-jetstream", "{}", r.dir);
        let name = t["name"].as_str().unwrap_or_default().to_string();
        assert!(names.insert(name), "{}: trigger names repeat", r.dir);
        let m = t["metadata"].as_object().unwrap();
        for (k, v) in m {
            assert!(
                NATS_JETSTREAM_METADATA.split_whitespace().any(|f| f == k),
                "{}: nats-jetstream metadata: unknown field {k}",
                r.dir
            );
            // KEDA's metadata is a map of strings.
            assert!(v.is_string(), "{}: metadata {k} = {v} is no string", r.dir);
        }
        assert_eq!(m["stream"], stream, "{}", r.dir);
        let lag = m["lagThreshold"].as_str().unwrap();
        assert!(
            lag.parse::<u64>().is_ok_and(|n| n > 0),
            "{}: lagThreshold {lag}",
            r.dir
        );
        let consumer = m["consumer"].as_str().unwrap().to_string();
        assert!(
            consumers.insert(consumer.clone()),
            "{}: {consumer} twice",
            r.dir
        );
    }
    let all: BTreeSet<String> = queues
        .iter()
        .flat_map(|q| Lane::all(q))
        .map(|l| l.consumer_name())
        .collect();
    let bare: BTreeSet<String> = queues
        .iter()
        .map(|q| Lane::bare(q).consumer_name())
        .collect();
    assert!(
        consumers == all || consumers == bare,
        "{}: the triggers' consumers {consumers:?} are neither every lane's {all:?} nor every \
         bare subject's {bare:?}",
        r.dir
    );
}
