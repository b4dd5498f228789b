//! Tool sources (MCP servers) in replays and evaluations.
//!
//! - An exact replay offers a source's tools as the journal recorded them
//!   (`tool.source_opened`: names, descriptions, input schemas, declarations), without asking
//!   the live server: [`RecordedSource`] serves each opening of the source again in order, and a
//!   recorded unavailability (`tool.source_unavailable`, with the `circuit.opened` before it) as
//!   the same failure. Its tools answer from the journal like every plain tool.
//! - A variant replay and an evaluation open the live source ([`MappedSource`]) and wrap each
//!   tool it gives: the variant's tools are answered from the journal, a double or (read-only)
//!   the server; an evaluation's side-effect tools by the suite's doubles, never the server.

use std::{collections::HashMap, sync::Arc};

use loom_core::{
    BoxFuture,
    event::{CircuitOpened, OfferedTool},
    ports::{CircuitNotice, SourceContext, SourceError, ToolSource},
    tool::{Tool, ToolDeclarations, ToolSpec},
};

use super::{RecordedTool, Recording, Serves};

/// What one opening of a source gave in the recorded run.
#[derive(Debug, Clone)]
pub(super) enum Opening {
    /// The tools it offered.
    Opened(Vec<OfferedTool>),
    /// It could not be reached.
    Unavailable {
        error: String,
        circuit: Option<CircuitNotice>,
    },
}

/// The openings of each source, in journal order, and how many were served.
#[derive(Debug, Default)]
pub(super) struct Openings {
    by_source: HashMap<String, (Vec<Opening>, usize)>,
    /// The last `circuit.opened` of an MCP target not yet followed by its source's outcome.
    circuit: Option<CircuitNotice>,
}

impl Openings {
    /// Records `tool.source_opened`.
    pub(super) fn opened(&mut self, source: &str, tools: &[OfferedTool]) {
        self.circuit = None;
        self.push(source, Opening::Opened(tools.to_vec()));
    }

    /// Records `circuit.opened` (an MCP source's breaker, read by the unavailability after it).
    pub(super) fn circuit(&mut self, opened: &CircuitOpened) {
        if opened.target_kind == "mcp" {
            self.circuit = Some(CircuitNotice {
                target: opened.target.clone(),
                failures: opened.failures,
                cooldown_s: opened.cooldown_s,
                error: opened.error.clone().unwrap_or_default(),
            });
        }
    }

    /// Records `tool.source_unavailable`.
    pub(super) fn unavailable(&mut self, source: &str, error: &str) {
        let circuit = self.circuit.take();
        self.push(
            source,
            Opening::Unavailable {
                error: error.to_owned(),
                circuit,
            },
        );
    }

    fn push(&mut self, source: &str, opening: Opening) {
        self.by_source
            .entry(source.to_owned())
            .or_default()
            .0
            .push(opening);
    }

    /// Whether the journal recorded any opening of `source`.
    pub(super) fn knows(&self, source: &str) -> bool {
        self.by_source.contains_key(source)
    }

    /// The next recorded opening of `source` (the last one again once all were served: a
    /// source opens at the run's start and at each resume, with the same tools).
    pub(super) fn next(&mut self, source: &str) -> Option<Opening> {
        let (openings, served) = self.by_source.get_mut(source)?;
        let opening = openings.get(*served).or_else(|| openings.last())?.clone();
        *served += 1;
        Some(opening)
    }

    /// The names of every tool a recorded opening offered.
    pub(super) fn tool_names(&self) -> impl Iterator<Item = &str> {
        self.by_source.values().flat_map(|(openings, _)| {
            openings.iter().flat_map(|opening| match opening {
                Opening::Opened(tools) => tools.iter().map(|t| t.name.as_str()).collect(),
                Opening::Unavailable { .. } => Vec::new(),
            })
        })
    }
}

/// A source replayed from the journal: its recorded openings, its tools answering from the
/// journal.
#[derive(Debug)]
pub(super) struct RecordedSource {
    pub(super) name: String,
    pub(super) book: Arc<Recording>,
}

impl ToolSource for RecordedSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn open<'a>(
        &'a self,
        _ctx: &'a SourceContext,
    ) -> BoxFuture<'a, Result<Vec<Arc<dyn Tool>>, SourceError>> {
        let opening = self.book.book().openings.next(&self.name);
        let outcome = match opening {
            Some(Opening::Opened(tools)) => Ok(tools
                .iter()
                .map(|offered| {
                    Arc::new(RecordedTool {
                        spec: spec_of(offered),
                        book: self.book.clone(),
                        serves: Serves::Journal,
                    }) as Arc<dyn Tool>
                })
                .collect()),
            Some(Opening::Unavailable { error, circuit }) => Err(SourceError {
                message: error,
                circuit,
            }),
            None => {
                self.book
                    .miss("source", format!("opening of {}", self.name));
                Err(SourceError {
                    message: format!(
                        "replay: the journal recorded no opening of tool source {}",
                        self.name
                    ),
                    circuit: None,
                })
            }
        };
        Box::pin(std::future::ready(outcome))
    }

    fn release<'a>(&'a self, _ctx: &'a SourceContext) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// The tool the run was offered, as the journal recorded it.
fn spec_of(offered: &OfferedTool) -> ToolSpec {
    ToolSpec {
        name: offered.name.clone(),
        description: offered.description.clone(),
        input_schema: offered.input_schema.clone(),
        kind: offered.kind,
        declarations: ToolDeclarations {
            side_effects: offered.side_effects,
            approval: offered.approval,
            idempotent: offered.idempotent,
            on_unknown: offered.on_unknown,
            timeout: offered
                .timeout_s
                .and_then(|s| std::time::Duration::try_from_secs_f64(s).ok()),
            offload_over: offered.offload_over,
            business_key: None,
        },
    }
}

/// How a [`MappedSource`] wraps each tool of the live source.
pub(super) type ToolMap = dyn Fn(Arc<dyn Tool>) -> Arc<dyn Tool> + Send + Sync;

/// A live source whose tools are wrapped as they open (a variant's or an evaluation's doubles).
/// It does not forward `shutdown`: the live source belongs to the instance, not to the replay.
pub(super) struct MappedSource {
    pub(super) inner: Arc<dyn ToolSource>,
    pub(super) map: Box<ToolMap>,
}

impl std::fmt::Debug for MappedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedSource")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl ToolSource for MappedSource {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn open<'a>(
        &'a self,
        ctx: &'a SourceContext,
    ) -> BoxFuture<'a, Result<Vec<Arc<dyn Tool>>, SourceError>> {
        Box::pin(async move {
            let tools = self.inner.open(ctx).await?;
            Ok(tools.into_iter().map(|tool| (self.map)(tool)).collect())
        })
    }

    fn release<'a>(&'a self, ctx: &'a SourceContext) -> BoxFuture<'a, ()> {
        self.inner.release(ctx)
    }
}
