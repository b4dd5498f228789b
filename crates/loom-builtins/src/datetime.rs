//! `current_datetime`: the time now, from the injected clock, in UTC and in a requested zone.
//!
//! Zones are IANA names (`Europe/Paris`), read with `jiff` from the system's zoneinfo with a
//! bundled copy of the database as fallback, `UTC`, or fixed offsets (`+02:00`, `-0530`, `+02`).

use std::sync::Arc;

use chrono::{DateTime, Datelike, FixedOffset, SecondsFormat, Utc, Weekday};
use loom_core::{
    BoxFuture,
    ports::Clock,
    tool::{FnTool, ToolDeclarations, ToolError, ToolKind, ToolOutput, ToolSpec},
};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    #[serde(default)]
    timezone: Option<String>,
}

/// The `current_datetime` tool: `{timezone?}` → `{utc, local, timezone, utc_offset, weekday}`.
///
/// `timezone` is an IANA name (`Europe/Paris`), `UTC`, or a fixed offset (`+02:00`); without
/// it, `local` is UTC. Times are RFC 3339 at second precision; `weekday` is the local one.
pub fn current_datetime(clock: Arc<dyn Clock>) -> FnTool {
    let spec = ToolSpec {
        name: "current_datetime".to_owned(),
        description: "The current date and time, in UTC and in a time zone (an IANA name such \
                      as Europe/Paris, UTC, or a fixed offset such as +02:00)."
            .to_owned(),
        input_schema: json!({
            "type": "object",
            "properties": {
                "timezone": {
                    "type": "string",
                    "description": "IANA time zone (Europe/Paris), UTC, or a fixed offset (+02:00). Default: UTC."
                }
            },
            "additionalProperties": false
        }),
        kind: ToolKind::Builtin,
        declarations: ToolDeclarations {
            idempotent: true,
            ..ToolDeclarations::default()
        },
    };
    FnTool::new(spec, move |_ctx, arguments| {
        let now = clock.now();
        let result = serde_json::from_value::<Args>(arguments)
            .map_err(|error| ToolError::new(format!("invalid arguments: {error}")))
            .and_then(|args| describe(now, args.timezone.as_deref()));
        Box::pin(async move { result.map(ToolOutput::json) }) as BoxFuture<'static, _>
    })
}

fn describe(now: DateTime<Utc>, timezone: Option<&str>) -> Result<Value, ToolError> {
    let name = timezone.map(str::trim).filter(|name| !name.is_empty());
    let (label, offset_seconds) = match name {
        None => ("UTC".to_owned(), 0),
        Some(name) => zone_offset(now, name)?,
    };
    let offset = FixedOffset::east_opt(offset_seconds)
        .ok_or_else(|| ToolError::new(format!("the offset of '{label}' is out of range")))?;
    let local = now.with_timezone(&offset);
    Ok(json!({
        "utc": now.to_rfc3339_opts(SecondsFormat::Secs, true),
        "local": local.to_rfc3339_opts(SecondsFormat::Secs, true),
        "timezone": label,
        "utc_offset": offset.to_string(),
        "weekday": weekday_name(local.weekday()),
    }))
}

/// The zone's label and its offset from UTC at `now`, in seconds.
fn zone_offset(now: DateTime<Utc>, name: &str) -> Result<(String, i32), ToolError> {
    if name.eq_ignore_ascii_case("utc") || name == "Z" {
        return Ok(("UTC".to_owned(), 0));
    }
    if name.starts_with(['+', '-']) {
        return fixed_offset(name).map(|seconds| (name.to_owned(), seconds));
    }
    let zone = jiff::tz::TimeZone::get(name).map_err(|_| unknown_zone(name))?;
    // chrono counts a leap second as nanoseconds past 1e9; jiff does not.
    let nanos = i32::try_from(now.timestamp_subsec_nanos().min(999_999_999)).unwrap_or(0);
    let instant = jiff::Timestamp::new(now.timestamp(), nanos)
        .map_err(|error| ToolError::new(format!("the clock's time is out of range: {error}")))?;
    let label = zone.iana_name().unwrap_or(name).to_owned();
    Ok((label, zone.to_offset(instant).seconds()))
}

/// `+HH`, `+HHMM` or `+HH:MM` (or `-`), at most 23:59.
fn fixed_offset(text: &str) -> Result<i32, ToolError> {
    let (sign, rest) = match text.split_at_checked(1) {
        Some(("-", rest)) => (-1, rest),
        Some(("+", rest)) => (1, rest),
        _ => return Err(unknown_zone(text)),
    };
    let (hours, minutes) = match (rest.len(), rest.as_bytes().get(2)) {
        _ if !rest.is_ascii() => return Err(unknown_zone(text)),
        (2, _) => (rest, "00"),
        (4, _) => (&rest[..2], &rest[2..]),
        (5, Some(b':')) => (&rest[..2], &rest[3..]),
        _ => return Err(unknown_zone(text)),
    };
    let number = |digits: &str| {
        digits
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| digits.parse::<i32>().ok())
            .flatten()
    };
    match (number(hours), number(minutes)) {
        (Some(hours), Some(minutes)) if hours < 24 && minutes < 60 => {
            Ok(sign * (hours * 3600 + minutes * 60))
        }
        _ => Err(unknown_zone(text)),
    }
}

fn unknown_zone(name: &str) -> ToolError {
    ToolError::new(format!(
        "unknown time zone '{name}': use an IANA name such as Europe/Paris or America/New_York, \
         UTC, or a fixed offset such as +02:00"
    ))
}

fn weekday_name(day: Weekday) -> &'static str {
    match day {
        Weekday::Mon => "Monday",
        Weekday::Tue => "Tuesday",
        Weekday::Wed => "Wednesday",
        Weekday::Thu => "Thursday",
        Weekday::Fri => "Friday",
        Weekday::Sat => "Saturday",
        Weekday::Sun => "Sunday",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_offsets() {
        assert_eq!(fixed_offset("+02:00"), Ok(7200));
        assert_eq!(fixed_offset("-0530"), Ok(-19800));
        assert_eq!(fixed_offset("+02"), Ok(7200));
        assert!(fixed_offset("+24:00").is_err());
        assert!(fixed_offset("+2:0").is_err());
        assert!(fixed_offset("+ab:cd").is_err());
        assert!(fixed_offset("+0é").is_err());
        assert!(fixed_offset("+0é1").is_err());
        assert!(fixed_offset("+02-00").is_err());
    }
}
