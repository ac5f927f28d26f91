//! Reads compose files: every service that runs the Tollgate image, with
//! `extends` resolved (`environment` merged by key, other fields replaced,
//! as compose does) and `${VAR}` interpolated from the operator's
//! environment.
//!
//! A string `command` or `entrypoint` is an error: its argv would depend on
//! compose's own splitting, so the files use the list form. Relative bind
//! mounts are taken from the extending file's folder (compose takes them
//! from the extended file's: the files here share one folder).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_norway::{Mapping, Value};

use crate::dockerfile::Image;
use crate::launch::{is_tollgate_image, Launch};

/// A service that runs the Tollgate image.
#[derive(Debug, Clone)]
pub struct Service {
    pub name: String,
    pub launch: Launch,
    /// Container side of each published port.
    pub container_ports: Vec<u16>,
    /// Bind mounts: (host path, resolved against the file's folder; path in
    /// the container).
    pub mounts: Vec<(PathBuf, String)>,
}

/// `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:?error}`,
/// `${VAR?error}`, `$VAR` and `$$`, as compose interpolates them.
pub fn interpolate(s: &str, vars: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at + 1..];
        if let Some(r) = rest.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let Some(r) = rest.strip_prefix('{') {
            let end = r
                .find('}')
                .ok_or_else(|| format!("unclosed ${{ in {s:?}"))?;
            let expr = &r[..end];
            rest = &r[end + 1..];
            let name_end = expr
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(expr.len());
            let (name, op) = expr.split_at(name_end);
            let value = vars.get(name).map(String::as_str);
            let set = value.is_some_and(|v| !v.is_empty());
            let resolved = match op {
                "" => value.unwrap_or("").to_owned(),
                _ if op.starts_with(":-") => {
                    if set { value.unwrap_or("") } else { &op[2..] }.to_owned()
                }
                _ if op.starts_with('-') => value.unwrap_or(&op[1..]).to_owned(),
                _ if op.starts_with(":?") || op.starts_with('?') => {
                    let required = if op.starts_with(':') {
                        set
                    } else {
                        value.is_some()
                    };
                    if !required {
                        let message = op.trim_start_matches(':').trim_start_matches('?');
                        return Err(format!("{name} must be set: {message}"));
                    }
                    value.unwrap_or("").to_owned()
                }
                _ => return Err(format!("cannot interpolate ${{{expr}}}")),
            };
            out.push_str(&resolved);
        } else {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            out.push_str(vars.get(&rest[..end]).map_or("", String::as_str));
            rest = &rest[end..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// `environment` as a map (list form `K=V` or map form); `None`: taken
/// from the operator's environment.
fn environment(v: Option<&Value>) -> BTreeMap<String, Option<String>> {
    let mut out = BTreeMap::new();
    match v {
        Some(Value::Mapping(m)) => {
            for (k, v) in m {
                if let Some(k) = scalar(k) {
                    out.insert(k, scalar(v));
                }
            }
        }
        Some(Value::Sequence(items)) => {
            for item in items.iter().filter_map(scalar) {
                match item.split_once('=') {
                    Some((k, v)) => out.insert(k.to_owned(), Some(v.to_owned())),
                    None => out.insert(item, None),
                };
            }
        }
        _ => {}
    }
    out
}

fn services_of(doc: &Value) -> Option<&Mapping> {
    doc.get("services").and_then(Value::as_mapping)
}

/// The service `name` of `services` (in the file in `dir`), with what it
/// extends merged in.
fn resolved(services: &Mapping, name: &str, dir: &Path, depth: u32) -> Result<Mapping, String> {
    if depth > 8 {
        return Err(format!("extends of {name} nests too deep"));
    }
    let service = services
        .get(name)
        .and_then(Value::as_mapping)
        .ok_or_else(|| format!("no service {name}"))?;
    let Some(extends) = service.get("extends") else {
        return Ok(service.clone());
    };
    let mut base = match extends {
        Value::String(base) => resolved(services, base, dir, depth + 1)?,
        Value::Mapping(m) => {
            let base = m.get("service").and_then(Value::as_str);
            let base = base.ok_or_else(|| format!("{name}: extends without service"))?;
            match m.get("file").and_then(Value::as_str) {
                None => resolved(services, base, dir, depth + 1)?,
                Some(file) => {
                    let path = dir.join(file);
                    let text = std::fs::read_to_string(&path)
                        .map_err(|e| format!("{name}: extends {}: {e}", path.display()))?;
                    let doc: Value = serde_norway::from_str(&text)
                        .map_err(|e| format!("{}: {e}", path.display()))?;
                    let services = services_of(&doc)
                        .ok_or_else(|| format!("{}: no services", path.display()))?;
                    let base_dir = path.parent().unwrap_or(dir);
                    resolved(services, base, base_dir, depth + 1)?
                }
            }
        }
        _ => return Err(format!("{name}: extends must be a name or a mapping")),
    };
    let mut env = environment(base.get("environment"));
    env.extend(environment(service.get("environment")));
    for (k, v) in service {
        if k.as_str() != Some("extends") {
            base.insert(k.clone(), v.clone());
        }
    }
    let env: Mapping = env
        .into_iter()
        .map(|(k, v)| (Value::String(k), v.map_or(Value::Null, Value::String)))
        .collect();
    base.insert("environment".into(), Value::Mapping(env));
    Ok(base)
}

/// A list-form command or entrypoint, interpolated.
fn argv(
    service: &Mapping,
    field: &str,
    vars: &BTreeMap<String, String>,
) -> Result<Option<Vec<String>>, String> {
    match service.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Sequence(items)) => items
            .iter()
            .map(|v| {
                let s = scalar(v).ok_or_else(|| format!("{field}: {v:?} is not a string"))?;
                interpolate(&s, vars)
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(other) => Err(format!(
            "{field} must be a list of arguments, got {other:?}"
        )),
    }
}

/// The Tollgate services of the compose file `label` (in `dir`), given the
/// image the repository's Dockerfile builds and the operator's `vars`.
pub fn services(
    label: &str,
    text: &str,
    dir: &Path,
    image: &Image,
    vars: &BTreeMap<String, String>,
) -> Result<Vec<Service>, String> {
    let doc: Value = serde_norway::from_str(text).map_err(|e| format!("{label}: {e}"))?;
    let all = services_of(&doc).ok_or_else(|| format!("{label}: no services"))?;
    let mut out = Vec::new();
    for name in all.keys().filter_map(Value::as_str) {
        let fail = |e: String| format!("{label}: service {name}: {e}");
        let service = resolved(all, name, dir, 0).map_err(fail)?;
        let image_name = service.get("image").and_then(Value::as_str).unwrap_or("");
        if !is_tollgate_image(&interpolate(image_name, vars).map_err(fail)?) {
            continue;
        }
        let entrypoint = argv(&service, "entrypoint", vars).map_err(fail)?;
        let command = argv(&service, "command", vars).map_err(fail)?;
        // As docker does: a new entrypoint drops the image's CMD.
        let cmd = match (&entrypoint, command) {
            (_, Some(c)) => c,
            (None, None) => image.cmd.clone(),
            (Some(_), None) => Vec::new(),
        };
        let mut full = entrypoint.unwrap_or_else(|| image.entrypoint.clone());
        full.extend(cmd);
        let mut env = image.env.clone();
        for (k, v) in environment(service.get("environment")) {
            let v = match v {
                Some(v) => interpolate(&v, vars).map_err(fail)?,
                None => vars.get(&k).cloned().unwrap_or_default(),
            };
            env.insert(k, v);
        }
        let mut container_ports = Vec::new();
        for port in service
            .get("ports")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
        {
            let target = match port {
                Value::Mapping(m) => m.get("target").and_then(scalar),
                other => scalar(other).map(|s| {
                    let s = s.split('/').next().unwrap_or("").to_owned();
                    s.rsplit(':').next().unwrap_or("").to_owned()
                }),
            };
            let target = target.ok_or_else(|| fail(format!("port {port:?}")))?;
            container_ports.push(target.parse().map_err(|_| fail(format!("port {target}")))?);
        }
        let mut mounts = Vec::new();
        for volume in service
            .get("volumes")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
        {
            let (source, target) = match volume {
                Value::Mapping(m) => (
                    m.get("source").and_then(scalar).unwrap_or_default(),
                    m.get("target").and_then(scalar).unwrap_or_default(),
                ),
                other => {
                    let s = interpolate(&scalar(other).unwrap_or_default(), vars).map_err(fail)?;
                    let mut parts = s.split(':');
                    let source = parts.next().unwrap_or("").to_owned();
                    (source, parts.next().unwrap_or("").to_owned())
                }
            };
            mounts.push((dir.join(source), target));
        }
        out.push(Service {
            name: name.to_owned(),
            launch: Launch {
                origin: format!("{label}: service {name}"),
                argv: full,
                env,
            },
            container_ports,
            mounts,
        });
    }
    Ok(out)
}
