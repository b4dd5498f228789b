//! # loom-cli
//!
//! The `loom` command line, as a library: a Rust user gets the whole CLI, with their own
//! tools registered, in their own binary:
//!
//! ```no_run
//! /// Calcule le prix TTC à partir d'un montant HT et d'un taux de TVA en pourcentage.
//! #[loom_ia::tool]
//! fn prix_ttc(montant_ht: f64, taux_tva: f64) -> String {
//!     format!("{:.2} € TTC", montant_ht * (1.0 + taux_tva / 100.0))
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     loom_cli::App::new().tool(prix_ttc_tool()).main()
//! }
//! ```
//!
//! Exit codes follow the reference: `0` done, `1` the run did not complete (or the journal
//! failed), `2` refused (bad configuration, unknown agent or run, conflict, a tenant budget
//! reached).
//!
//! **Architecture invariant:** the CLI depends on the `loom-ia` facade only; output written
//! for people lives here, the data it shows comes from the facade's projections.

mod cli;
mod inspect;
mod keys;
mod output;
#[cfg(unix)]
mod reload;
mod render;
mod retention;
mod sandbox;
mod sessions;
mod worker;

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::ExitCode,
    sync::Arc,
};

pub use cli::Cli;
use loom_ia::{JudgeCondition, SourceFactory, TenantBudget, Tool, policy::Policy};

/// Exit code: done.
pub const OK: u8 = 0;
/// Exit code: the run failed, was cancelled, or the journal could not be used.
pub const FAILED: u8 = 1;
/// Exit code: refused (configuration, unknown agent or run, conflict).
pub const REFUSED: u8 = 2;

/// The `loom` application, with the tools of the binary that embeds it.
#[derive(Debug, Default)]
pub struct App {
    tools: Vec<Arc<dyn Tool>>,
    policies: Vec<(String, Arc<dyn Policy>)>,
    conditions: Vec<(String, Condition)>,
    sources: Vec<(String, Factory)>,
    default_config: Option<PathBuf>,
    tenant_budgets: Vec<(String, TenantBudget)>,
}

impl App {
    /// An application with no tools.
    pub fn new() -> App {
        App::default()
    }

    /// Registers a tool (under its own name) in every Loom the application builds.
    pub fn tool(mut self, tool: impl Tool + 'static) -> App {
        self.tools.push(Arc::new(tool));
        self
    }

    /// Registers a policy under `name` (the `hook` agents reference in `policies:`) in every
    /// Loom the application builds.
    pub fn policy(mut self, name: impl Into<String>, policy: impl Policy + 'static) -> App {
        self.policies.push((name.into(), Arc::new(policy)));
        self
    }

    /// Registers a judge condition under `name` (the `when.condition` judges reference) in
    /// every Loom the application builds: such a judge runs only when the condition holds.
    pub fn condition(
        mut self,
        name: impl Into<String>,
        condition: impl JudgeCondition + 'static,
    ) -> App {
        self.conditions
            .push((name.into(), Condition(Arc::new(condition))));
        self
    }

    /// Registers `factory` as the builder of the tool sources of kind `kind`
    /// (`tool_sources: [{name, kind, params}]`) in every Loom the application builds, whatever
    /// the command (`run`, `validate`, `serve`, `worker`, `mcp`, …): see
    /// [`Loom::register_source`](loom_ia::Loom::register_source). A kind already registered
    /// (the built-in `forge`, `openapi`, or the same kind twice) is refused when the Loom is
    /// built (exit code 2); a configuration naming a kind nobody registered is refused when its
    /// agent is resolved, at `tool_sources[i].kind`, naming the registered kinds.
    pub fn source(mut self, kind: impl Into<String>, factory: Arc<dyn SourceFactory>) -> App {
        self.sources.push((kind.into(), Factory(factory)));
        self
    }

    /// Sets `tenant`'s period ceilings in every Loom the application builds: a run of the tenant
    /// is then refused (exit code 2) once it spent that much in the current UTC day or month.
    pub fn tenant_budget(mut self, tenant: impl Into<String>, budget: TenantBudget) -> App {
        self.tenant_budgets.push((tenant.into(), budget));
        self
    }

    /// The configuration used when `--config` is not given (instead of `loom.yaml`).
    pub fn default_config(mut self, path: impl Into<PathBuf>) -> App {
        self.default_config = Some(path.into());
        self
    }

    /// Parses the process arguments, runs the command, returns the exit code.
    pub fn main(self) -> ExitCode {
        ExitCode::from(self.run_from(std::env::args_os()))
    }

    /// Parses `args` (the first is the program name) and runs the command.
    pub fn run_from<I, T>(self, args: I) -> u8
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        let cli = match <Cli as clap::Parser>::try_parse_from(args.clone()) {
            Ok(cli) => cli,
            Err(error) => {
                let code = if error.use_stderr() { REFUSED } else { OK };
                let _ = error.print();
                return code;
            }
        };
        let runtime = match tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => {
                eprintln!("error: cannot start the async runtime: {error}");
                return FAILED;
            }
        };
        runtime.block_on(cli::execute(cli, self, args))
    }

    pub(crate) fn config_path(&self, given: Option<&Path>) -> PathBuf {
        match (given, &self.default_config) {
            (Some(path), _) => path.to_path_buf(),
            (None, Some(default)) => relative_to_cwd(default),
            (None, None) => PathBuf::from("loom.yaml"),
        }
    }

    pub(crate) fn tools(&self) -> &[Arc<dyn Tool>] {
        &self.tools
    }

    pub(crate) fn policies(&self) -> &[(String, Arc<dyn Policy>)] {
        &self.policies
    }

    pub(crate) fn conditions(&self) -> impl Iterator<Item = (&str, &Arc<dyn JudgeCondition>)> {
        self.conditions
            .iter()
            .map(|(name, condition)| (name.as_str(), &condition.0))
    }

    pub(crate) fn sources(&self) -> impl Iterator<Item = (&str, &Arc<dyn SourceFactory>)> {
        self.sources
            .iter()
            .map(|(kind, factory)| (kind.as_str(), &factory.0))
    }

    pub(crate) fn tenant_budgets(&self) -> &[(String, TenantBudget)] {
        &self.tenant_budgets
    }
}

/// A registered judge condition (conditions are closures: shown by name only).
#[derive(Clone)]
struct Condition(Arc<dyn JudgeCondition>);

impl std::fmt::Debug for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JudgeCondition")
    }
}

/// A registered tool source factory (factories are closures: shown by kind only).
#[derive(Clone)]
struct Factory(Arc<dyn SourceFactory>);

impl std::fmt::Debug for Factory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SourceFactory")
    }
}

/// `path` relative to the working directory when it lies below it (shorter messages).
fn relative_to_cwd(path: &Path) -> PathBuf {
    let (Ok(cwd), Ok(full)) = (std::env::current_dir(), std::fs::canonicalize(path)) else {
        return path.to_path_buf();
    };
    full.strip_prefix(&cwd)
        .map(Path::to_path_buf)
        .unwrap_or(full)
}
