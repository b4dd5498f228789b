//! `excel`: list the sheets of a workbook, read a sheet or an A1 range, and write cells and
//! formulas into a copy, inside declared folders only.
//!
//! The folders are those of [`local_files`](crate::local_files), with the same checks and
//! refusals (`declared-folder`, `no-parent`, `inside-roots`, `folder-rights`, `size-cap`), and
//! every file is opened through the folder's directory handle.
//!
//! - `sheets`: the sheet names of a workbook (`.xlsx`, `.xlsm`, `.xlsb`, `.xls`, `.ods`, read
//!   with calamine) and the used range of each; needs `read`.
//! - `read`: a sheet (the first by default) or an A1 `range` of it, as rows of typed values:
//!   numbers, strings, booleans, dates as ISO 8601 strings (`2026-03-31`), errors as their
//!   text (`#DIV/0!`), `null` for an empty cell; and the formulas of the cells read. At most
//!   [`READ_CELL_CAP`] cells (and `max_rows` rows) come back, whole rows, with
//!   `truncated: true` when rows were left out. Needs `read`.
//! - `write`: copies an `.xlsx` workbook (read with umya-spreadsheet), sets cells (`value`)
//!   and formulas (`formula`) on one sheet, and writes the result to `output_path` (an
//!   `.xlsx` name) in `output_folder` (by default the source's folder). The source needs
//!   `read`; the output needs `write` when it is a new file and `overwrite` when it exists,
//!   the source included: a workbook is replaced only when the call names it as the output
//!   and its folder grants `overwrite` (which asks for approval by default). Formulas are
//!   written, **not recalculated**: no spreadsheet engine runs here (no LibreOffice), so a
//!   formula cell has no value until a spreadsheet application opens the file.
//!
//! A workbook above [`WORKBOOK_CAP_BYTES`] is refused (rule `size-cap`), never cut.
//! Declared side effects, as for `local_files`: `reversible` (a copy can be deleted) when a
//! folder grants `write` or `overwrite`, `none` otherwise.

mod a1;
mod cells;

use std::{
    collections::BTreeMap,
    io::{Cursor, Read, Write},
    sync::Arc,
};

use calamine::{Range, Reader, Sheets};
use loom_core::{
    BoxFuture,
    tool::{FnTool, SideEffects, ToolDeclarations, ToolError, ToolKind, ToolOutput, ToolSpec},
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use self::a1::{Area, Cell};
use crate::{
    BuiltinError,
    files::{
        Folder, Resolved, Right, Root, find_root, io_error, not_found, open_regular, open_roots,
        require, resolve, shown_path,
    },
    refusal, rules,
};

/// The largest workbook read: 16 MiB on disk (rule `size-cap`).
pub const WORKBOOK_CAP_BYTES: u64 = 16 * 1024 * 1024;
/// The most cells one `read` returns (whole rows; the rest announced as truncated).
pub const READ_CELL_CAP: u64 = 10_000;
/// The most cells one `write` sets.
pub const WRITE_CELL_CAP: usize = 10_000;
/// The extensions read, lower case.
const READABLE: [&str; 5] = ["xlsx", "xlsm", "xlsb", "xls", "ods"];

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Op {
    Sheets,
    Read,
    Write,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    op: Op,
    folder: String,
    path: String,
    #[serde(default)]
    sheet: Option<String>,
    #[serde(default)]
    range: Option<String>,
    #[serde(default)]
    max_rows: Option<u64>,
    #[serde(default)]
    output_folder: Option<String>,
    #[serde(default)]
    output_path: Option<String>,
    #[serde(default)]
    cells: Option<Vec<CellWrite>>,
}

/// One cell to set: a value or a formula.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CellWrite {
    cell: String,
    /// `Some(Value::Null)` when the call gives `null` (the cell emptied), `None` when absent.
    #[serde(default, deserialize_with = "present")]
    value: Option<Value>,
    #[serde(default)]
    formula: Option<String>,
}

/// A key that is present, `null` included.
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

/// The `excel` tool over `folders`.
///
/// Arguments: `{op: "sheets" | "read" | "write", folder, path, sheet?, range?, max_rows?,
/// output_folder?, output_path?, cells?: [{cell, value | formula}]}` (see the module
/// documentation for what each does). Folders grant `read`, `write` and `overwrite` as for
/// `local_files`; `delete` is never used.
///
/// # Errors
/// No folder, a name that is invalid or declared twice, a folder granting no right, a path
/// that does not exist or is not a directory.
pub fn excel(folders: Vec<Folder>) -> Result<FnTool, BuiltinError> {
    let roots = Arc::new(open_roots(folders)?);
    let spec = spec(&roots);
    Ok(FnTool::new(spec, move |_ctx, arguments| {
        let roots = roots.clone();
        Box::pin(async move {
            let args: Args = serde_json::from_value(arguments)
                .map_err(|error| ToolError::new(format!("invalid arguments: {error}")))?;
            tokio::task::spawn_blocking(move || run(&roots, args))
                .await
                .map_err(|error| {
                    ToolError::new(format!("the workbook operation failed: {error}"))
                })?
        }) as BoxFuture<'static, _>
    }))
}

fn spec(roots: &[Root]) -> ToolSpec {
    let writes = roots
        .iter()
        .any(|root| root.rights.allows(Right::Write) || root.rights.allows(Right::Overwrite));
    let folders: Vec<String> = roots
        .iter()
        .map(|root| format!("{} ({})", root.name, root.rights.describe()))
        .collect();
    let names: Vec<&str> = roots.iter().map(|root| root.name.as_str()).collect();
    ToolSpec {
        name: "excel".to_owned(),
        description: format!(
            "Spreadsheets inside these folders only, with these rights: {}. op 'sheets' lists \
             a workbook's sheets (.xlsx, .xlsm, .xlsb, .xls, .ods); op 'read' returns a sheet \
             or an A1 range ('A1:D20') as rows of values (dates as ISO strings, empty cells \
             null) and its formulas, at most {READ_CELL_CAP} cells; op 'write' copies an .xlsx \
             workbook, sets 'cells' (a value or a formula each) on one sheet and saves the \
             copy as 'output_path' (.xlsx, a new file needs 'write', replacing one needs \
             'overwrite'). Formulas are written, not recalculated: their cells have no value \
             until a spreadsheet application opens the file.",
            folders.join("; ")
        ),
        input_schema: json!({
            "type": "object",
            "properties": {
                "op": {"type": "string", "enum": ["sheets", "read", "write"]},
                "folder": {"type": "string", "enum": names},
                "path": {"type": "string", "description": "The workbook, inside the folder."},
                "sheet": {
                    "type": "string",
                    "description": "The sheet (read, write); the first one by default."
                },
                "range": {
                    "type": "string",
                    "description": "A1 range to read ('B2:D40' or 'C7'); the used range by default."
                },
                "max_rows": {
                    "type": "integer", "minimum": 1,
                    "description": "At most this many rows (read)."
                },
                "output_folder": {
                    "type": "string", "enum": names,
                    "description": "Folder of the copy (write); the source's by default."
                },
                "output_path": {
                    "type": "string",
                    "description": "Name of the copy, ending in .xlsx (write)."
                },
                "cells": {
                    "type": "array",
                    "description": "The cells to set (write).",
                    "items": {
                        "type": "object",
                        "properties": {
                            "cell": {"type": "string", "description": "A1 reference, like 'D14'."},
                            "value": {
                                "type": ["string", "number", "boolean", "null"],
                                "description": "The value (null empties the cell)."
                            },
                            "formula": {"type": "string", "description": "A formula, like '=SUM(D2:D13)'."}
                        },
                        "required": ["cell"],
                        "additionalProperties": false
                    }
                }
            },
            "required": ["op", "folder", "path"],
            "additionalProperties": false
        }),
        kind: ToolKind::Builtin,
        declarations: ToolDeclarations {
            side_effects: if writes {
                SideEffects::Reversible
            } else {
                SideEffects::None
            },
            idempotent: !writes,
            ..ToolDeclarations::default()
        },
    }
}

fn run(roots: &[Root], args: Args) -> Result<ToolOutput, ToolError> {
    let root = find_root(roots, &args.folder)?;
    tracing::debug!(folder = %root.name, op = ?args.op, path = %args.path, "excel call");
    let result = match args.op {
        Op::Sheets => sheets(root, &args),
        Op::Read => read(root, &args),
        Op::Write => write(roots, root, args),
    };
    if let Err(error) = &result {
        tracing::info!(folder = %root.name, error = %error, "excel refused or failed");
    }
    result
}

/// The lower-case extension of `path`, if any.
fn extension(path: &str) -> Option<String> {
    std::path::Path::new(path)
        .extension()
        .and_then(|ext| ext.to_str())
        .map(str::to_ascii_lowercase)
}

/// The bytes of the workbook `path` in `root` (read right, size cap, a known extension), and
/// the path as shown.
fn load(root: &Root, path: &str) -> Result<(Vec<u8>, String), ToolError> {
    require(root, Right::Read, path)?;
    let resolved = resolve(root, path)?;
    let shown = shown_path(root, &resolved.real);
    if !extension(path).is_some_and(|ext| READABLE.contains(&ext.as_str())) {
        return Err(ToolError::new(format!(
            "'{shown}' is not a workbook: 'path' must end in .xlsx, .xlsm, .xlsb, .xls or .ods"
        )));
    }
    if !resolved.exists {
        return Err(not_found(&shown));
    }
    let mut options = cap_std::fs::OpenOptions::new();
    options.read(true);
    let file = open_regular(root, &resolved, &shown, &options)?;
    let too_big = |size: u64| {
        refusal(
            rules::SIZE_CAP,
            format!(
                "'{shown}' is {size} bytes, above the workbook cap of {WORKBOOK_CAP_BYTES} bytes \
                 (16 MiB)"
            ),
        )
    };
    let size = file
        .metadata()
        .map_err(|error| io_error(&shown, &error))?
        .len();
    if size > WORKBOOK_CAP_BYTES {
        return Err(too_big(size));
    }
    let mut bytes = Vec::new();
    file.take(WORKBOOK_CAP_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| io_error(&shown, &error))?;
    if bytes.len() as u64 > WORKBOOK_CAP_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    Ok((bytes, shown))
}

type Workbook = Sheets<Cursor<Vec<u8>>>;

fn open(bytes: Vec<u8>, shown: &str) -> Result<Workbook, ToolError> {
    calamine::open_workbook_auto_from_rs(Cursor::new(bytes))
        .map_err(|error| ToolError::new(format!("'{shown}' cannot be read as a workbook: {error}")))
}

/// `sheet`, or the first sheet; an unknown name is an error listing the sheets.
fn pick_sheet(names: &[String], sheet: Option<&str>, shown: &str) -> Result<String, ToolError> {
    match sheet {
        Some(name) if names.iter().any(|n| n == name) => Ok(name.to_owned()),
        Some(name) => Err(ToolError::new(format!(
            "'sheet': '{shown}' has no sheet named '{name}'; its sheets are: {}",
            quoted(names)
        ))),
        None => names
            .first()
            .cloned()
            .ok_or_else(|| ToolError::new(format!("'{shown}' has no sheet"))),
    }
}

fn quoted(names: &[String]) -> String {
    let names: Vec<String> = names.iter().map(|name| format!("'{name}'")).collect();
    names.join(", ")
}

/// The used area of a calamine range, in absolute positions.
fn used<T: calamine::CellType>(range: &Range<T>) -> Option<Area> {
    let (start, end) = (range.start()?, range.end()?);
    Some(Area {
        start: Cell::new(start.0, start.1),
        end: Cell::new(end.0, end.1),
    })
}

fn sheets(root: &Root, args: &Args) -> Result<ToolOutput, ToolError> {
    let (bytes, shown) = load(root, &args.path)?;
    let mut book = open(bytes, &shown)?;
    let mut listed = Vec::new();
    for name in book.sheet_names() {
        let range = book
            .worksheet_range(&name)
            .map_err(|error| ToolError::new(format!("sheet '{name}' of '{shown}': {error}")))?;
        let area = used(&range);
        listed.push(json!({
            "name": name,
            "range": area.map(|area| area.to_string()),
            "rows": area.map_or(0, |area| area.height()),
            "columns": area.map_or(0, |area| area.width()),
        }));
    }
    Ok(ToolOutput::json(
        json!({"folder": root.name, "path": shown, "sheets": listed}),
    ))
}

fn read(root: &Root, args: &Args) -> Result<ToolOutput, ToolError> {
    let requested = args.range.as_deref().map(Area::parse).transpose();
    let requested = requested.map_err(ToolError::new)?;
    if args.max_rows == Some(0) {
        return Err(ToolError::new("'max_rows' must be at least 1"));
    }
    let (bytes, shown) = load(root, &args.path)?;
    let mut book = open(bytes, &shown)?;
    let sheet = pick_sheet(&book.sheet_names(), args.sheet.as_deref(), &shown)?;
    let range = book
        .worksheet_range(&sheet)
        .map_err(|error| ToolError::new(format!("sheet '{sheet}' of '{shown}': {error}")))?;
    // Formulas are extra information: a format whose formulas cannot be read still gives its
    // values.
    let formulas = book.worksheet_formula(&sheet).unwrap_or_else(|error| {
        tracing::info!(sheet = %sheet, path = %shown, error = %error, "excel: formulas not read");
        Range::empty()
    });
    // What is read: the requested area cut at the last used row and column (past them every
    // cell is empty), or the used area.
    let area = match (requested, used(&range)) {
        (Some(requested), Some(used)) => Some(Area {
            start: requested.start,
            end: Cell::new(
                requested.end.row.min(used.end.row.max(requested.start.row)),
                requested
                    .end
                    .column
                    .min(used.end.column.max(requested.start.column)),
            ),
        }),
        (Some(requested), None) => Some(Area {
            start: requested.start,
            end: requested.start,
        }),
        (None, used) => used,
    };
    let mut result = json!({"folder": root.name, "path": shown, "sheet": sheet});
    let Some(area) = area else {
        result["range"] = Value::Null;
        result["rows"] = json!([]);
        result["total_rows"] = json!(0);
        result["truncated"] = json!(false);
        return Ok(ToolOutput::json(result));
    };
    let width = area.width();
    if width > READ_CELL_CAP {
        return Err(ToolError::new(format!(
            "'range': {area} is {width} columns wide, above the {READ_CELL_CAP} cells one read \
             returns; ask for fewer columns"
        )));
    }
    let mut rows_kept = (READ_CELL_CAP / width).min(area.height());
    if let Some(max_rows) = args.max_rows {
        rows_kept = rows_kept.min(max_rows);
    }
    let mut rows = Vec::new();
    // Both bounds are within u32: rows_kept is at most the area's height.
    for row in area.start.row..area.start.row + rows_kept as u32 {
        let values: Vec<Value> = (area.start.column..=area.end.column)
            .map(|column| {
                range
                    .get_value((row, column))
                    .map_or(Value::Null, cells::to_json)
            })
            .collect();
        rows.push(Value::Array(values));
    }
    let returned = Area {
        start: area.start,
        end: Cell::new(
            area.start.row + (rows_kept as u32).saturating_sub(1),
            area.end.column,
        ),
    };
    let mut found = Map::new();
    if let Some(origin) = formulas.start() {
        for (r, c, formula) in formulas.used_cells() {
            // Relative positions within the formula range: both fit in u32 like it does.
            let cell = Cell::new(origin.0 + r as u32, origin.1 + c as u32);
            if !formula.is_empty() && rows_kept > 0 && returned.contains(cell) {
                found.insert(cell.to_string(), json!(format!("={formula}")));
            }
        }
    }
    result["range"] = json!(returned.to_string());
    result["rows"] = Value::Array(rows);
    result["total_rows"] = json!(area.height());
    result["truncated"] = json!(rows_kept < area.height());
    if !found.is_empty() {
        result["formulas"] = Value::Object(found);
    }
    Ok(ToolOutput::json(result))
}

fn write(roots: &[Root], root: &Root, args: Args) -> Result<ToolOutput, ToolError> {
    let Some(output_path) = args.output_path.as_deref() else {
        return Err(ToolError::new(
            "op 'write' needs 'output_path', the name of the copy (ending in .xlsx)",
        ));
    };
    let changes = parse_cells(args.cells.as_deref().unwrap_or_default())?;
    if extension(&args.path).as_deref() != Some("xlsx") {
        return Err(ToolError::new(format!(
            "'path': only an .xlsx workbook can be copied and written ('{}'); read it and \
             write its values into an .xlsx workbook instead",
            args.path
        )));
    }
    if extension(output_path).as_deref() != Some("xlsx") {
        return Err(ToolError::new(format!(
            "'output_path' is '{output_path}': the copy is written as .xlsx, so its name must \
             end in .xlsx"
        )));
    }
    let out_root = match &args.output_folder {
        Some(name) => find_root(roots, name)?,
        None => root,
    };
    // The output's rights are checked before anything is read.
    if !out_root.rights.allows(Right::Write) && !out_root.rights.allows(Right::Overwrite) {
        require(out_root, Right::Write, output_path)?;
    }
    let output = resolve(out_root, output_path)?;
    let out_shown = shown_path(out_root, &output.real);
    require(
        out_root,
        if output.exists {
            Right::Overwrite
        } else {
            Right::Write
        },
        &out_shown,
    )?;
    let (bytes, shown) = load(root, &args.path)?;
    let mut book = umya_spreadsheet::reader::xlsx::read_reader(Cursor::new(bytes), true)
        .map_err(|error| ToolError::new(format!("'{shown}' cannot be read as xlsx: {error}")))?;
    let names: Vec<String> = book
        .sheet_collection()
        .iter()
        .map(|sheet| sheet.name().to_owned())
        .collect();
    let sheet = pick_sheet(&names, args.sheet.as_deref(), &shown)?;
    let worksheet = book
        .sheet_by_name_mut(&sheet)
        .map_err(|error| ToolError::new(format!("sheet '{sheet}' of '{shown}': {error}")))?;
    for (cell, change) in &changes {
        let target = worksheet.cell_mut(cell.to_string().as_str());
        match change {
            Change::Formula(formula) => {
                target.set_formula(formula.as_str());
            }
            Change::Value(Value::Null) => {
                target.set_blank();
            }
            Change::Value(Value::Bool(b)) => {
                target.set_value_bool(*b);
            }
            Change::Value(Value::Number(n)) => {
                target.set_value_number(n.as_f64().unwrap_or_default());
            }
            Change::Value(Value::String(text)) => {
                target.set_value_string(text.as_str());
            }
            // `parse_cells` lets scalars through only.
            Change::Value(_) => {}
        }
    }
    let mut written = Vec::new();
    umya_spreadsheet::writer::xlsx::write_writer(&book, &mut written)
        .map_err(|error| ToolError::new(format!("the copy cannot be written: {error}")))?;
    save(out_root, &output, &out_shown, &written)?;
    Ok(ToolOutput::json(json!({
        "folder": out_root.name,
        "path": out_shown,
        "source": {"folder": root.name, "path": shown},
        "sheet": sheet,
        "cells_written": changes.len(),
        "created": !output.exists,
        "recalculated": false,
    })))
}

/// What one cell becomes.
#[derive(Debug)]
enum Change {
    Value(Value),
    /// The formula without its leading `=`, as a workbook stores it.
    Formula(String),
}

/// The cells of a `write`, checked: A1 references, one of `value` (a scalar) and `formula`
/// each, at most [`WRITE_CELL_CAP`]; the same cell twice keeps the last.
fn parse_cells(cells: &[CellWrite]) -> Result<BTreeMap<Cell, Change>, ToolError> {
    if cells.is_empty() {
        return Err(ToolError::new(
            "op 'write' needs 'cells', the cells to set: [{cell: 'D14', value: 12} or \
             {cell: 'D15', formula: '=SUM(D2:D14)'}]",
        ));
    }
    if cells.len() > WRITE_CELL_CAP {
        return Err(ToolError::new(format!(
            "'cells' has {} entries; one write sets at most {WRITE_CELL_CAP}",
            cells.len()
        )));
    }
    let mut changes = BTreeMap::new();
    for (i, entry) in cells.iter().enumerate() {
        let cell = Cell::parse(entry.cell.trim())
            .map_err(|why| ToolError::new(format!("'cells[{i}].cell': {why}")))?;
        let change = match (&entry.value, &entry.formula) {
            (Some(_), Some(_)) => {
                return Err(ToolError::new(format!(
                    "'cells[{i}]' ({cell}) has both 'value' and 'formula'; give one"
                )));
            }
            (None, None) => {
                return Err(ToolError::new(format!(
                    "'cells[{i}]' ({cell}) has neither 'value' nor 'formula'"
                )));
            }
            (Some(value @ (Value::Array(_) | Value::Object(_))), None) => {
                return Err(ToolError::new(format!(
                    "'cells[{i}].value' ({cell}) is {value}: a cell holds a string, a number, \
                     a boolean or null"
                )));
            }
            (Some(value), None) => Change::Value(value.clone()),
            (None, Some(formula)) => {
                let formula = formula.trim();
                let formula = formula.strip_prefix('=').unwrap_or(formula).trim();
                if formula.is_empty() {
                    return Err(ToolError::new(format!(
                        "'cells[{i}].formula' ({cell}) is empty"
                    )));
                }
                Change::Formula(formula.to_owned())
            }
        };
        changes.insert(cell, change);
    }
    Ok(changes)
}

/// Writes `bytes` to `output` through its folder's handle: a new file with `create_new` (a
/// link planted since the check is never followed), an existing one (the `overwrite` right
/// checked) emptied once known to be a regular file inside the folder.
fn save(root: &Root, output: &Resolved, shown: &str, bytes: &[u8]) -> Result<(), ToolError> {
    let mut file = if output.exists {
        let mut options = cap_std::fs::OpenOptions::new();
        options.write(true);
        let file = open_regular(root, output, shown, &options)?;
        file.set_len(0).map_err(|error| io_error(shown, &error))?;
        file
    } else {
        if let Some(parent) = output
            .relative
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
        {
            root.dir
                .create_dir_all(parent)
                .map_err(|error| io_error(shown, &error))?;
        }
        root.dir
            .open_with(
                &output.relative,
                cap_std::fs::OpenOptions::new().write(true).create_new(true),
            )
            .map_err(|error| io_error(shown, &error))?
    };
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|error| io_error(shown, &error))
}
