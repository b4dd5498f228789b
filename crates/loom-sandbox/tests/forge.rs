//! The forge on the local sandbox, through its tools as a run sees them: a definition whose
//! examples pass is published and offered to the tenant's next runs only; failing examples
//! (a wrong output, a program that does not print JSON, one that loops past its wall time,
//! one that forks without end) are refused by rule and publish nothing; a call's input is
//! checked against the tool's schema; `call` serves only the tools of its own run. Skipped
//! with a notice when bubblewrap cannot create namespaces here, failed instead under
//! `LOOM_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use loom_core::{
    ports::{SourceContext, ToolSource},
    sandbox::{Limits, rules as sandbox_rules},
    tool::{Tool, ToolContext, ToolError, ToolOutput},
};
use loom_sandbox::{
    LocalSandbox,
    forge::{ForgeSource, catalog::Catalog, rules, runner::Runner},
};
use serde_json::{Value, json};

const DOUBLE: &str =
    "import json, sys\nn = json.load(sys.stdin)['n']\nprint(json.dumps({'r': n * 2}))\n";

struct Lab {
    _root: tempfile::TempDir,
    source: ForgeSource,
}

fn lab(test: &str) -> Option<Lab> {
    if !loom_testkit::services::namespaces(test) {
        return None;
    }
    let root = tempfile::tempdir().unwrap();
    let sandbox = LocalSandbox::new(root.path().join("sandbox")).unwrap();
    let source = ForgeSource::new(
        "forge",
        Catalog::new(root.path().join("catalog")),
        Runner {
            sandbox: Arc::new(sandbox),
            limits: Limits {
                wall_ms: 3_000,
                output_bytes: 4_096,
                ..Limits::default()
            },
            network: false,
        },
    );
    Some(Lab {
        _root: root,
        source,
    })
}

fn ctx(tenant: &str, run: &str, call: &str) -> ToolContext {
    ToolContext {
        tenant_id: tenant.into(),
        session_id: format!("s-{run}"),
        run_id: run.into(),
        call_id: call.into(),
        idempotency_key: format!("{:0>64}", format!("{run}{call}").replace('-', "")),
        traceparent: None,
    }
}

impl Lab {
    async fn tools(&self, tenant: &str, run: &str) -> Vec<Arc<dyn Tool>> {
        let ctx = SourceContext {
            tenant_id: tenant.into(),
            session_id: format!("s-{run}"),
            run_id: run.into(),
        };
        self.source.open(&ctx).await.unwrap()
    }

    async fn call(
        &self,
        tenant: &str,
        run: &str,
        call: &str,
        tool: &str,
        arguments: Value,
    ) -> Result<ToolOutput, ToolError> {
        let tools = self.tools(tenant, run).await;
        let tool = tools
            .iter()
            .find(|t| t.spec().name == tool)
            .unwrap_or_else(|| panic!("{tool} not offered"));
        tool.call(ctx(tenant, run, call), arguments).await
    }
}

fn definition(name: &str, code: &str, examples: Value) -> Value {
    json!({
        "name": name,
        "description": "Doubles n.",
        "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
        "code": code,
        "examples": examples,
    })
}

fn names(tools: &[Arc<dyn Tool>]) -> Vec<String> {
    tools.iter().map(|t| t.spec().name.clone()).collect()
}

#[tokio::test]
async fn a_tool_whose_examples_pass_is_published_and_offered_to_the_next_runs() {
    let Some(lab) = lab("a_tool_whose_examples_pass") else {
        return;
    };
    let examples =
        json!([{"input": {"n": 2}, "output": {"r": 4}}, {"input": {"n": 0}, "output": {"r": 0}}]);
    let out = lab
        .call(
            "acme",
            "r1",
            "c1",
            "define",
            definition("double", DOUBLE, examples),
        )
        .await
        .unwrap();
    let data = out.data.unwrap();
    assert_eq!(data["defined"], true, "{data}");
    assert_eq!(data["name"], "forge__double");
    assert_eq!(data["examples"].as_array().unwrap().len(), 2);
    // In its run, through `call`; its input checked against its schema.
    let out = lab
        .call(
            "acme",
            "r1",
            "c2",
            "call",
            json!({"name": "double", "input": {"n": 21}}),
        )
        .await
        .unwrap();
    assert_eq!(out.data, Some(json!({"r": 42})));
    let error = lab
        .call(
            "acme",
            "r1",
            "c3",
            "call",
            json!({"name": "double", "input": {"n": "x"}}),
        )
        .await
        .unwrap_err();
    assert_eq!(error.rule, Some(rules::INPUT), "{}", error.message);
    // The next run is offered it by name, and `call` sends it there.
    let tools = lab.tools("acme", "r2").await;
    assert_eq!(names(&tools), ["define", "call", "double"]);
    let out = lab
        .call("acme", "r2", "c1", "double", json!({"n": 5}))
        .await
        .unwrap();
    assert_eq!(out.data, Some(json!({"r": 10})));
    let error = lab
        .call(
            "acme",
            "r2",
            "c2",
            "call",
            json!({"name": "double", "input": {"n": 1}}),
        )
        .await
        .unwrap_err();
    assert_eq!(error.rule, Some(rules::OFFERED));
    // The name is taken for good; another tenant sees nothing and may take it.
    let error = lab
        .call(
            "acme",
            "r2",
            "c3",
            "define",
            definition(
                "double",
                "print(1)",
                json!([{"input": {"n": 1}, "output": 1}]),
            ),
        )
        .await
        .unwrap_err();
    assert_eq!(error.rule, Some(rules::NAME_TAKEN));
    assert_eq!(names(&lab.tools("globex", "r3").await), ["define", "call"]);
    let error = lab
        .call(
            "globex",
            "r3",
            "c1",
            "call",
            json!({"name": "double", "input": {"n": 1}}),
        )
        .await
        .unwrap_err();
    assert_eq!(error.rule, Some(rules::UNKNOWN));
}

/// The outcome of the first example of a refused definition, and that nothing was published.
async fn refused(lab: &Lab, name: &str, code: &str, output: Value) -> Value {
    let out = lab
        .call(
            "acme",
            "r1",
            &format!("c-{name}"),
            "define",
            definition(name, code, json!([{"input": {"n": 1}, "output": output}])),
        )
        .await
        .unwrap();
    assert!(out.is_error);
    let data = out.data.unwrap();
    assert_eq!(data["defined"], false);
    assert_eq!(data["rule"], rules::EXAMPLE_FAILED);
    assert!(
        lab.source.catalog().get("acme", name).is_err(),
        "{name} published"
    );
    data["examples"][0].clone()
}

#[tokio::test]
async fn failing_examples_are_refused_by_rule_and_publish_nothing() {
    let Some(lab) = lab("failing_examples_are_refused") else {
        return;
    };
    let wrong = refused(&lab, "wrong", DOUBLE, json!({"r": 3})).await;
    assert_eq!(wrong["first_difference"]["at"], "/r", "{wrong}");
    assert_eq!(wrong["output"], json!({"r": 2}));
    let float = refused(&lab, "float", "print(2.0)", json!(2)).await;
    assert_eq!(float["first_difference"]["actual"], json!(2.0), "{float}");
    let chatty = refused(&lab, "chatty", "print('hello')", json!("hello")).await;
    assert_eq!(chatty["rule"], rules::OUTPUT_JSON, "{chatty}");
    let crash = refused(&lab, "crash", "raise SystemExit(3)", json!(1)).await;
    assert_eq!(crash["rule"], rules::EXIT, "{crash}");
    assert!(crash["error"].as_str().unwrap().contains("code 3"));
    let spin = refused(&lab, "spin", "while True:\n    pass\n", json!(1)).await;
    assert!(
        [sandbox_rules::WALL_TIME, sandbox_rules::CPU_TIME]
            .contains(&spin["rule"].as_str().unwrap()),
        "{spin}"
    );
    let bomb = refused(
        &lab,
        "bomb",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        json!(1),
    )
    .await;
    assert!(bomb["passed"] == false, "{bomb}");
    let flood = refused(&lab, "flood", "print('1' * 100000)", json!(1)).await;
    assert_eq!(flood["rule"], sandbox_rules::OUTPUT_SIZE, "{flood}");
    // Checks that need no run: a bad schema, an example's input off the schema.
    let mut bad = definition("bad", DOUBLE, json!([{"input": {"n": 1}, "output": 2}]));
    bad["input_schema"] = json!({"type": "object", "properties": {"n": {"type": "nope"}}});
    let error = lab
        .call("acme", "r1", "c-bad", "define", bad)
        .await
        .unwrap_err();
    assert_eq!(error.rule, Some(rules::SCHEMA));
    let off = definition("off", DOUBLE, json!([{"input": {"m": 1}, "output": 2}]));
    let error = lab
        .call("acme", "r1", "c-off", "define", off)
        .await
        .unwrap_err();
    assert_eq!(error.rule, Some(rules::EXAMPLE_INPUT));
    assert_eq!(names(&lab.tools("acme", "r2").await), ["define", "call"]);
}
