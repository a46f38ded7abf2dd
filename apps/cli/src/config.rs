//! `--config run.toml`: a whole run in one TOML file.
//!
//! The file's top-level keys are the command's flags without the dashes (`duration_ms = 5`
//! or `duration-ms = 5`; lists as arrays, `protocol = ["ford", "pandora"]`; switches as
//! booleans, `json = true`), plus an optional `command = "bench locks"` used when the
//! command line names no command. Flags given on the command line override the file's.
//! The keys become flags before the command line is parsed, so a file is checked exactly as
//! the same flags typed by hand are (see `examples/runs/`).

use std::ffi::OsString;

use anyhow::{Context as _, bail};

/// The command line with the flags of its `--config FILE` (if any) added.
///
/// # Errors
/// The file cannot be read, is not TOML, or holds a value that is not a flag's.
pub fn expand(argv: Vec<OsString>) -> anyhow::Result<Vec<OsString>> {
    let args: Vec<String> = argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut path = None;
    for (i, a) in args.iter().enumerate() {
        if a == "--config" {
            path = Some(
                args.get(i + 1)
                    .cloned()
                    .context("--config needs the path of a TOML run file")?,
            );
        } else if let Some(p) = a.strip_prefix("--config=") {
            path = Some(p.to_string());
        }
    }
    let Some(path) = path else {
        return Ok(argv);
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read --config file {path}"))?;
    let table: toml::Table = toml::from_str(&text)
        .map_err(|e| anyhow::anyhow!("--config file {path}: {}", e.message().trim_end()))?;
    let mut out: Vec<OsString> = argv;
    // A command is named if the first word that is neither a flag nor `--config`'s value is
    // one of dmem's commands.
    let named_command = args
        .iter()
        .skip(1)
        .find(|a| !a.starts_with('-') && !is_value_of_config(&args, a))
        .is_some_and(|a| COMMANDS.contains(&a.as_str()));
    let mut tail = Vec::new();
    for (key, value) in &table {
        if key == "command" {
            let toml::Value::String(words) = value else {
                bail!("--config file {path}: `command` must be a string such as \"bench locks\"");
            };
            if !named_command {
                for (i, w) in words.split_whitespace().enumerate() {
                    out.insert(1 + i, w.into());
                }
            }
            continue;
        }
        let flag = format!("--{}", key.replace('_', "-"));
        let given = args
            .iter()
            .any(|a| *a == flag || a.starts_with(&format!("{flag}=")));
        if given {
            continue;
        }
        match value {
            toml::Value::Boolean(true) => tail.push(flag),
            toml::Value::Boolean(false) => {}
            toml::Value::String(s) => tail.push(format!("{flag}={s}")),
            toml::Value::Integer(i) => tail.push(format!("{flag}={i}")),
            toml::Value::Float(x) => tail.push(format!("{flag}={x}")),
            toml::Value::Array(items) => {
                let parts = items
                    .iter()
                    .map(|v| match v {
                        toml::Value::String(s) => Ok(s.clone()),
                        toml::Value::Integer(i) => Ok(i.to_string()),
                        toml::Value::Float(x) => Ok(x.to_string()),
                        _ => bail!("--config file {path}: `{key}` holds a list of lists or tables"),
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                tail.push(format!("{flag}={}", parts.join(",")));
            }
            _ => bail!("--config file {path}: `{key}` must be a string, number, boolean or list"),
        }
    }
    out.extend(tail.into_iter().map(OsString::from));
    Ok(out)
}

/// dmem's top-level commands.
const COMMANDS: [&str; 9] = [
    "perf",
    "bench",
    "litmus",
    "recover",
    "reproduce",
    "mn",
    "cn",
    "cluster",
    "help",
];

fn is_value_of_config(args: &[String], a: &str) -> bool {
    args.windows(2).any(|w| w[0] == "--config" && w[1] == a)
}
