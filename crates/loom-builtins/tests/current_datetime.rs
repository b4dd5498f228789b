//! `current_datetime` against a fixed clock.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::ctx;

use std::sync::Arc;

use chrono::{DateTime, TimeZone, Utc};
use loom_builtins::current_datetime;
use loom_core::{
    ports::Clock,
    tool::{Tool, ToolKind},
};
use serde_json::{Value, json};

#[derive(Debug)]
struct FixedClock(DateTime<Utc>);

impl Clock for FixedClock {
    fn now(&self) -> DateTime<Utc> {
        self.0
    }
}

async fn call(arguments: Value) -> Result<Value, String> {
    // Sunday 29 November 2026, 23:30:05 UTC.
    let clock = FixedClock(Utc.with_ymd_and_hms(2026, 11, 29, 23, 30, 5).unwrap());
    let tool = current_datetime(Arc::new(clock));
    assert_eq!(tool.spec().name, "current_datetime");
    assert_eq!(tool.spec().kind, ToolKind::Builtin);
    tool.call(ctx(), arguments)
        .await
        .map(|output| output.data.unwrap())
        .map_err(|error| error.message)
}

#[tokio::test]
async fn utc_by_default() {
    let data = call(json!({})).await.unwrap();
    assert_eq!(
        data,
        json!({
            "utc": "2026-11-29T23:30:05Z",
            "local": "2026-11-29T23:30:05Z",
            "timezone": "UTC",
            "utc_offset": "+00:00",
            "weekday": "Sunday",
        })
    );
}

#[tokio::test]
async fn an_iana_zone_moves_the_local_day() {
    let data = call(json!({"timezone": "Europe/Paris"})).await.unwrap();
    assert_eq!(data["utc"], "2026-11-29T23:30:05Z");
    assert_eq!(data["local"], "2026-11-30T00:30:05+01:00");
    assert_eq!(data["timezone"], "Europe/Paris");
    assert_eq!(data["weekday"], "Monday");
    // Summer time is the zone's business, not a fixed offset.
    let data = call(json!({"timezone": "America/New_York"})).await.unwrap();
    assert_eq!(data["local"], "2026-11-29T18:30:05-05:00");
}

#[tokio::test]
async fn fixed_offsets_and_utc_spellings() {
    let data = call(json!({"timezone": "-05:30"})).await.unwrap();
    assert_eq!(data["local"], "2026-11-29T18:00:05-05:30");
    assert_eq!(data["utc_offset"], "-05:30");
    let data = call(json!({"timezone": "utc"})).await.unwrap();
    assert_eq!(data["timezone"], "UTC");
}

#[tokio::test]
async fn an_unknown_zone_is_explained() {
    let error = call(json!({"timezone": "Mars/Olympus"})).await.unwrap_err();
    assert!(
        error.contains("unknown time zone 'Mars/Olympus'"),
        "{error}"
    );
    assert!(error.contains("Europe/Paris"), "{error}");
}
