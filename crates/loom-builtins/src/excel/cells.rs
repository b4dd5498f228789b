//! Cell values as the model reads them: numbers, strings, booleans, dates as ISO 8601
//! strings, errors as their Excel text (`#DIV/0!`), empty cells as `null`.

use calamine::{Data, ExcelDateTime};
use serde_json::{Value, json};

/// The JSON value of one cell.
pub(crate) fn to_json(data: &Data) -> Value {
    match data {
        Data::Int(n) => json!(n),
        // NaN and infinities have no JSON form; Excel stores neither, so this is only defence.
        Data::Float(x) if x.is_finite() => json!(x),
        Data::Float(x) => json!(x.to_string()),
        Data::String(text) => json!(text),
        Data::Bool(b) => json!(b),
        Data::DateTime(datetime) => json!(iso(datetime)),
        Data::DateTimeIso(text) | Data::DurationIso(text) => json!(text),
        Data::Error(error) => json!(error.to_string()),
        Data::Empty => Value::Null,
    }
}

/// A date as `2026-03-31`, a date and time as `2026-03-31T14:05:00` (milliseconds when there
/// are any), a duration as `PT5400S`: Excel stores no time zone, so none is given.
fn iso(datetime: &ExcelDateTime) -> String {
    if datetime.is_duration() {
        let seconds = datetime.as_f64() * 86_400.0;
        let rounded = (seconds * 1000.0).round() / 1000.0;
        return format!("PT{rounded}S");
    }
    let (year, month, day, hour, minute, second, milli) = datetime.to_ymd_hms_milli();
    let date = format!("{year:04}-{month:02}-{day:02}");
    match (hour, minute, second, milli) {
        (0, 0, 0, 0) => date,
        (_, _, _, 0) => format!("{date}T{hour:02}:{minute:02}:{second:02}"),
        _ => format!("{date}T{hour:02}:{minute:02}:{second:02}.{milli:03}"),
    }
}

#[cfg(test)]
mod tests {
    use calamine::{CellErrorType, ExcelDateTimeType};

    use super::*;

    #[test]
    fn values_are_typed() {
        assert_eq!(to_json(&Data::Int(3)), json!(3));
        assert_eq!(to_json(&Data::Float(2.5)), json!(2.5));
        assert_eq!(to_json(&Data::String("a".into())), json!("a"));
        assert_eq!(to_json(&Data::Bool(true)), json!(true));
        assert_eq!(to_json(&Data::Empty), Value::Null);
        assert_eq!(to_json(&Data::Error(CellErrorType::Div0)), json!("#DIV/0!"));
    }

    #[test]
    fn dates_are_iso_strings() {
        let at = |value, kind| to_json(&Data::DateTime(ExcelDateTime::new(value, kind, false)));
        // 45943 is 2025-10-13 in the 1900 date system.
        assert_eq!(
            at(45943.0, ExcelDateTimeType::DateTime),
            json!("2025-10-13")
        );
        assert_eq!(
            at(45943.5, ExcelDateTimeType::DateTime),
            json!("2025-10-13T12:00:00")
        );
        assert_eq!(at(0.0625, ExcelDateTimeType::TimeDelta), json!("PT5400S"));
    }
}
