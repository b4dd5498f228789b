//! The commands: each opens the service, checks the model (except `reindex`), acts and prints.

use std::{
    io::{Read as _, Write as _},
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::Context as _;
use loom_notes_core::{Document, EvalCase, Extracted, SearchQuery, SourceKind};

use crate::{
    cli::{Cli, Command},
    output,
    progress::Progress,
    serve,
    setup::{self, Opened},
    sources,
};

/// Runs the command line: `Ok(code)` for a handled outcome, `Err` for an error printed as
/// `error: …` (exit 1).
pub(crate) async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let opened = setup::open(cli.fake, cli.data_dir.as_deref()).await?;
    if !matches!(cli.command, Command::Reindex) {
        opened.service.check_model().await?;
    }
    match cli.command {
        Command::Serve { http } => {
            match http {
                Some(addr) => serve::http(opened, addr).await?,
                None => serve::stdio(opened).await?,
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Eval { path, k, json } => eval(&opened, path, usize::from(k), json).await,
        command => {
            print(&one(&opened, command).await?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Writes `text` to stdout as is.
fn print(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
}

/// The commands that print one result: what they print.
async fn one(opened: &Opened, command: Command) -> anyhow::Result<String> {
    let service = &opened.service;
    let line = |text: String| format!("{text}\n");
    Ok(match command {
        Command::AddText {
            project,
            title,
            text,
            tags,
        } => {
            let text = match text {
                Some(text) => text,
                None => read_stdin()?,
            };
            let result = service
                .add_text(&text, &title, &project, tags_of(&tags))
                .await?;
            line(output::json(&result)?)
        }
        Command::AddUrl { project, url, tags } => {
            let fetcher = sources::fetcher(service.settings())?;
            let page = fetcher.fetch(url.trim()).await?;
            let extracted = Extracted {
                title: page.title,
                text: page.text,
            };
            let result = service
                .ingest(
                    extracted,
                    SourceKind::Url,
                    Some(page.source),
                    &project,
                    tags_of(&tags),
                )
                .await?;
            line(output::json(&result)?)
        }
        Command::AddFile {
            project,
            path,
            tags,
        } => {
            let file = sources::files(service.settings()).read(&path)?;
            let extracted = Extracted {
                title: file.title,
                text: file.text,
            };
            let result = service
                .ingest(
                    extracted,
                    SourceKind::File,
                    Some(file.source),
                    &project,
                    tags_of(&tags),
                )
                .await?;
            line(output::json(&result)?)
        }
        Command::Search {
            query,
            project,
            tags,
            k,
        } => {
            let query = SearchQuery {
                query,
                project,
                tags,
                k: usize::from(k),
                min_score: None,
            };
            output::hits(&service.search(&query).await?)
        }
        Command::Get { doc_id } => line(output::json(&service.get(&doc_id).await?)?),
        Command::List { project, n } => {
            output::list(&service.list(project.as_deref(), usize::from(n)).await?)
        }
        Command::Projects => line(output::json(&service.projects().await?)?),
        Command::Delete { doc_id } => line(output::json(&service.delete(&doc_id).await?)?),
        Command::Export { path } => {
            let path = path.unwrap_or_else(|| opened.data_dir.join("export.jsonl"));
            let docs = service.export().await?;
            write_export(&path, &docs)?;
            line(format!(
                "{} document(s) exported to {}",
                docs.len(),
                path.display()
            ))
        }
        Command::Import { path } => {
            let path = path.unwrap_or_else(|| opened.data_dir.join("export.jsonl"));
            let docs = read_export(&path)?;
            let bar = Progress::new("import");
            let report = service
                .import(docs, &|done, total| bar.update(done, total))
                .await;
            bar.finish();
            let report = report?;
            line(format!(
                "{} imported, {} skipped",
                report.imported, report.skipped
            ))
        }
        Command::EvalAdd {
            query,
            doc_id,
            project,
            path,
        } => {
            let path = path.unwrap_or_else(|| opened.data_dir.join("golden.jsonl"));
            let doc = service.get(&doc_id).await?;
            let case = EvalCase {
                query: query.clone(),
                doc_id,
                title: Some(doc.title.clone()),
                project,
            };
            append_case(&path, &case)?;
            line(format!("added: \"{query}\" → {}", doc.title))
        }
        Command::Reindex => {
            let bar = Progress::new("reindex");
            let count = service
                .reindex(&|done, total| bar.update(done, total))
                .await;
            bar.finish();
            line(format!("{} document(s) reindexed", count?))
        }
        Command::Eval { .. } | Command::Serve { .. } => {
            anyhow::bail!("internal: this command prints through its own path")
        }
    })
}

/// `eval`: the report of the golden set at `path` (default DATA_DIR/golden.jsonl); a set
/// without cases is an error telling how to add some.
async fn eval(
    opened: &Opened,
    path: Option<PathBuf>,
    k: usize,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let path = path.unwrap_or_else(|| opened.data_dir.join("golden.jsonl"));
    let cases = read_cases(&path)?;
    if cases.is_empty() {
        eprintln!(
            "error: no cases in {} — add some with `loom-notes eval-add`",
            path.display()
        );
        return Ok(ExitCode::FAILURE);
    }
    let bar = Progress::new("eval");
    let report = opened
        .service
        .eval(&cases, k, &|done, total| bar.update(done, total))
        .await;
    bar.finish();
    let report = report?;
    if json {
        print(&format!("{}\n", output::json(&report)?));
    } else {
        print(&report.render_text());
    }
    Ok(ExitCode::SUCCESS)
}

/// The tags option: `None` when no `-t` was given.
fn tags_of(tags: &[String]) -> Option<&[String]> {
    (!tags.is_empty()).then_some(tags)
}

/// The whole of stdin (the text of `add-text` without TEXT).
fn read_stdin() -> anyhow::Result<String> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("cannot read the text from stdin")?;
    Ok(text)
}

/// One document per line, compact JSON.
fn write_export(path: &Path, docs: &[Document]) -> anyhow::Result<()> {
    let mut text = String::new();
    for doc in docs {
        text.push_str(&serde_json::to_string(doc)?);
        text.push('\n');
    }
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// The documents of an export file, one per non-blank line; a line that is not a document is
/// an error naming the file and the line.
fn read_export(path: &Path) -> anyhow::Result<Vec<Document>> {
    let text = read_file(path)?;
    json_lines(path, &text)
}

/// The cases of a golden set; a missing file has none.
fn read_cases(path: &Path) -> anyhow::Result<Vec<EvalCase>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = read_file(path)?;
    json_lines(path, &text)
}

fn read_file(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

fn json_lines<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> anyhow::Result<Vec<T>> {
    let mut items = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let item = serde_json::from_str(line)
            .with_context(|| format!("{}, line {}", path.display(), number + 1))?;
        items.push(item);
    }
    Ok(items)
}

/// Appends `case` to the golden set at `path` (compact JSON, absent fields left out).
fn append_case(path: &Path, case: &EvalCase) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    writeln!(file, "{}", serde_json::to_string(case)?)
        .with_context(|| format!("cannot write {}", path.display()))
}
