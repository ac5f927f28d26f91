//! Reads Kubernetes manifests: the pods each workload makes (a StatefulSet
//! of N replicas: pods NAME-0 .. NAME-(N-1)), and for each container that
//! runs the Tollgate image its argv and environment as the kubelet would
//! give them.
//!
//! `command` replaces the image's ENTRYPOINT and drops its CMD; `args`
//! replaces the CMD. Environment: literal values (with `$(VAR)` expanded
//! from the variables before it), the pod's name and namespace, ConfigMap
//! keys from the same manifests; a Secret key becomes a stand-in value
//! (secrets are never in the files).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_norway::Value;

use crate::dockerfile::Image;
use crate::launch::{is_tollgate_image, Launch};

/// The namespace the pods are read as being in.
pub const NAMESPACE: &str = "tollgate-test";

/// One YAML document of a manifest file.
#[derive(Debug, Clone)]
pub struct Object {
    pub file: String,
    pub value: Value,
}

impl Object {
    pub fn kind(&self) -> &str {
        self.value.get("kind").and_then(Value::as_str).unwrap_or("")
    }

    pub fn name(&self) -> &str {
        self.value
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("")
    }
}

/// Every document of `text` (a file may hold several, split by `---`).
pub fn objects(file: &str, text: &str) -> Result<Vec<Object>, String> {
    let mut out = Vec::new();
    for doc in serde_norway::Deserializer::from_str(text) {
        let value = Value::deserialize(doc).map_err(|e| format!("{file}: {e}"))?;
        if value.is_null() {
            continue;
        }
        if value.get("apiVersion").is_none() || value.get("kind").is_none() {
            return Err(format!("{file}: a document without apiVersion and kind"));
        }
        out.push(Object {
            file: file.to_owned(),
            value,
        });
    }
    Ok(out)
}

/// A pod a workload makes.
#[derive(Debug, Clone)]
pub struct Pod {
    pub name: String,
    /// The workload, e.g. `deploy/kubernetes/statefulset.yaml: StatefulSet tollgate`.
    pub origin: String,
    /// The pod template's `spec`.
    pub spec: Value,
    pub labels: BTreeMap<String, String>,
}

/// The pods of every workload in `objects`.
pub fn pods(objects: &[Object]) -> Vec<Pod> {
    let mut out = Vec::new();
    for o in objects {
        let origin = format!("{}: {} {}", o.file, o.kind(), o.name());
        let spec = o.value.get("spec");
        let (template, names): (Option<&Value>, Vec<String>) = match o.kind() {
            "Pod" => (Some(&o.value), vec![o.name().to_owned()]),
            "StatefulSet" => {
                let replicas = spec
                    .and_then(|s| s.get("replicas"))
                    .and_then(Value::as_u64)
                    .unwrap_or(1);
                let names = (0..replicas).map(|i| format!("{}-{i}", o.name()));
                (spec.and_then(|s| s.get("template")), names.collect())
            }
            "Deployment" | "DaemonSet" | "ReplicaSet" | "Job" => (
                spec.and_then(|s| s.get("template")),
                vec![format!("{}-7d4b9c8f6-x2x9z", o.name())],
            ),
            _ => (None, Vec::new()),
        };
        let Some(template) = template else { continue };
        let labels: BTreeMap<String, String> = template
            .get("metadata")
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_mapping)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.as_str()?.to_owned(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        for name in names {
            out.push(Pod {
                name,
                origin: origin.clone(),
                spec: template.get("spec").cloned().unwrap_or(Value::Null),
                labels: labels.clone(),
            });
        }
    }
    out
}

/// The containers of a pod that run the Tollgate image.
pub fn tollgate_containers(pod: &Pod) -> Vec<&Value> {
    pod.spec
        .get("containers")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
        .filter(|c| {
            c.get("image")
                .and_then(Value::as_str)
                .is_some_and(is_tollgate_image)
        })
        .collect()
}

/// Kubernetes' expansion of command, args and env values: `$(VAR)` from
/// the variables defined so far (unknown ones stay as written, so a shell's
/// `$(cmd ...)` survives), and `$$` is one `$`.
fn expand(s: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let (Some(r), Some(end)) = (after.strip_prefix('('), after.find(')')) {
            let name = &r[..end - 1];
            match env.get(name) {
                Some(v) => out.push_str(v),
                None => out.push_str(&rest[at..at + 2 + end]),
            }
            rest = &after[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

fn strings(v: Option<&Value>) -> Option<Vec<String>> {
    v.and_then(Value::as_sequence).map(|items| {
        items
            .iter()
            .map(|i| i.as_str().map_or_else(|| format!("{i:?}"), str::to_owned))
            .collect()
    })
}

/// The value of an env entry's `valueFrom`.
fn value_from(from: &Value, pod: &Pod, objects: &[Object]) -> Result<String, String> {
    if let Some(field) = from.get("fieldRef") {
        let path = field.get("fieldPath").and_then(Value::as_str).unwrap_or("");
        return match path {
            "metadata.name" => Ok(pod.name.clone()),
            "metadata.namespace" => Ok(NAMESPACE.to_owned()),
            other => Err(format!("fieldRef {other} is not read by this test")),
        };
    }
    let name_key = |r: &Value| {
        (
            r.get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            r.get("key")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
        )
    };
    if let Some(secret) = from.get("secretKeyRef") {
        let (name, key) = name_key(secret);
        return Ok(format!("stand-in for secret {name}/{key}"));
    }
    if let Some(map) = from.get("configMapKeyRef") {
        let (name, key) = name_key(map);
        return objects
            .iter()
            .find(|o| o.kind() == "ConfigMap" && o.name() == name)
            .and_then(|o| o.value.get("data")?.get(key.as_str())?.as_str())
            .map(str::to_owned)
            .ok_or_else(|| format!("configMapKeyRef {name}/{key} is not in the manifests"));
    }
    Err(format!("valueFrom {from:?} is not read by this test"))
}

/// The argv and environment `container` of `pod` runs with.
pub fn launch(
    pod: &Pod,
    container: &Value,
    image: &Image,
    objects: &[Object],
) -> Result<Launch, String> {
    let cname = container.get("name").and_then(Value::as_str).unwrap_or("?");
    let origin = format!("{} pod {} container {cname}", pod.origin, pod.name);
    let mut env = image.env.clone();
    for var in container
        .get("env")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
    {
        let name = var
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let value = match (var.get("value"), var.get("valueFrom")) {
            (Some(v), _) => expand(v.as_str().unwrap_or(""), &env),
            (None, Some(from)) => {
                value_from(from, pod, objects).map_err(|e| format!("{origin}: {name}: {e}"))?
            }
            (None, None) => String::new(),
        };
        env.insert(name, value);
    }
    let command = strings(container.get("command"));
    let args = strings(container.get("args"));
    let mut argv = match &command {
        Some(c) => c.clone(),
        None => image.entrypoint.clone(),
    };
    match (args, &command) {
        (Some(a), _) => argv.extend(a),
        (None, None) => argv.extend(image.cmd.iter().cloned()),
        (None, Some(_)) => {}
    }
    let argv = argv.iter().map(|a| expand(a, &env)).collect();
    Ok(Launch { origin, argv, env })
}
