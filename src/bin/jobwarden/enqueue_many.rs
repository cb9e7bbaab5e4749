//! `jobwarden enqueue-many [FILE]`: many jobs at once from JSON lines, one job spec per line
//! (the fields of SQL `enqueue_many()`), in one transaction: all of them, or none when a line
//! is refused, the error naming the line.

use super::BadArgs;
use anyhow::{anyhow, Context, Result};
use jobwarden::client::{Client, ClientError};
use jobwarden::contract::MAX_ENQUEUE_MANY;
use serde_json::Value;
use std::io::Read;
use std::time::Instant;

/// Lines sent per statement (each statement takes at most [`MAX_ENQUEUE_MANY`]).
const CHUNK: usize = 10_000;
const _: () = assert!(CHUNK <= MAX_ENQUEUE_MANY);

/// Reads the specs of `file` (`-`: standard input): each non-blank line a JSON object.
/// Returns them with their line numbers.
fn read_specs(file: &str) -> Result<Vec<(usize, Value)>> {
    let mut text = String::new();
    if file == "-" {
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading standard input")?;
    } else {
        text = std::fs::read_to_string(file)
            .map_err(|e| BadArgs(format!("FILE: cannot read {file}: {e}")))?;
    }
    let mut specs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let spec: Value = serde_json::from_str(line).map_err(|e| {
            BadArgs(format!(
                "line {}: not JSON ({e}); each line is one job, e.g. \
                 {{\"queue\": \"email\", \"payload\": {{\"to\": \"a@example.com\"}}}}",
                i + 1
            ))
        })?;
        specs.push((i + 1, spec));
    }
    if specs.is_empty() {
        return Err(BadArgs(format!(
            "{}: holds no job; give one JSON object per line",
            if file == "-" { "standard input" } else { file }
        ))
        .into());
    }
    Ok(specs)
}

/// A refusal of `jobs[i]` (of the chunk whose first spec is `chunk[0]`) as its line.
fn on_line(message: &str, chunk: &[(usize, Value)]) -> String {
    let line = jobwarden::client::member_of(message).and_then(|n| chunk.get(n.wrapping_sub(1)));
    match line {
        Some((line, _)) => format!("line {line}: {message}"),
        None => message.to_string(),
    }
}

pub async fn run(client: &Client, file: &str, print_ids: bool) -> Result<()> {
    let specs = read_specs(file)?;
    let started = Instant::now();
    let mut conn = client.store().raw().await?;
    let tx = conn.transaction().await?;
    let mut ids = Vec::with_capacity(specs.len());
    for chunk in specs.chunks(CHUNK) {
        let got = client
            .enqueue_specs_in(&*tx, chunk.iter().map(|(_, s)| s.clone()).collect())
            .await
            .map_err(|e| match e {
                ClientError::Invalid(m) | ClientError::Conflict(m) => {
                    anyhow!(BadArgs(on_line(&m, chunk)))
                }
                other => anyhow!(other),
            })?;
        ids.extend(got);
    }
    tx.commit().await?;
    let took = started.elapsed().as_secs_f64();
    if print_ids {
        for id in &ids {
            println!("{id}");
        }
    }
    eprintln!(
        "{} jobs enqueued in {took:.2} s ({:.0} jobs/s), in one transaction; the workers \
         publish them",
        ids.len(),
        ids.len() as f64 / took.max(1e-9)
    );
    Ok(())
}

/// `jobwarden enqueue-batch [FILE]`: the lines of FILE as one batch, with its callbacks (JSON
/// job specs), in one transaction. Prints the batch's id.
pub async fn run_batch(
    client: &Client,
    file: &str,
    id: Option<String>,
    on_complete: Option<String>,
    on_success: Option<String>,
) -> Result<()> {
    let specs = read_specs(file)?;
    if specs.len() > MAX_ENQUEUE_MANY {
        return Err(BadArgs(format!(
            "{} jobs: a batch has at most {MAX_ENQUEUE_MANY} members",
            specs.len()
        ))
        .into());
    }
    let mut batch = serde_json::Map::new();
    if let Some(id) = id {
        batch.insert("id".into(), id.into());
    }
    for (flag, name, text) in [
        ("--on-complete", "on_complete", on_complete),
        ("--on-success", "on_success", on_success),
    ] {
        if let Some(text) = text {
            let spec: Value = serde_json::from_str(&text).map_err(|e| {
                BadArgs(format!(
                    "{flag}: not JSON ({e}); give a job spec, e.g. \
                     '{{\"queue\": \"reports\", \"payload\": {{}}}}'"
                ))
            })?;
            batch.insert(name.into(), spec);
        }
    }
    batch.insert(
        "jobs".into(),
        Value::Array(specs.iter().map(|(_, s)| s.clone()).collect()),
    );
    let started = Instant::now();
    let mut conn = client.store().raw().await?;
    let tx = conn.transaction().await?;
    let id = client
        .enqueue_batch_spec_in(&*tx, Value::Object(batch))
        .await
        .map_err(|e| match e {
            ClientError::Invalid(m) | ClientError::Conflict(m) => {
                anyhow!(BadArgs(on_line(&m, &specs)))
            }
            other => anyhow!(other),
        })?;
    tx.commit().await?;
    println!("{id}");
    eprintln!(
        "batch {id}: {} jobs enqueued in {:.2} s, in one transaction; `jobwarden batch show {id}` \
         follows it",
        specs.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
