//! `excel`: a workbook built with umya-spreadsheet in a temporary folder, its sheets listed and
//! read back through the tool (typed values, ranges, caps), formulas written into a copy and
//! checked with calamine, and every refusal and argument error.

#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::ctx;

use std::{fs, io::Cursor, os::unix::fs::symlink, path::Path};

use calamine::{Data, Reader, Xlsx};
use loom_builtins::{Folder, Right, Rights, excel, refusal_rule};
use loom_core::tool::{FnTool, SideEffects, Tool, ToolError};
use serde_json::{Value, json};
use tempfile::TempDir;

/// A workbook of two sheets: `Factures` (a header, four invoices: text, numbers, booleans,
/// dates, one empty cell) and `Notes`.
fn workbook(path: &Path) {
    let mut book = umya_spreadsheet::new_file();
    let sheet = book.sheet_mut(0).unwrap();
    sheet.set_name("Factures");
    let rows: [(&str, &str, f64, bool, f64); 4] = [
        ("F-001", "Dupont", 1200.0, true, 46_023.0),
        ("F-002", "Martin", 350.5, false, 46_054.0),
        ("F-003", "", 980.0, false, 46_082.0),
        ("F-004", "Durand", 75.25, true, 46_113.0),
    ];
    for (column, title) in ["Numéro", "Client", "Montant", "Payée", "Échéance"]
        .iter()
        .enumerate()
    {
        sheet
            .cell_mut((column as u32 + 1, 1))
            .set_value_string(*title);
    }
    for (i, (number, client, amount, paid, due)) in rows.iter().enumerate() {
        let row = i as u32 + 2;
        sheet.cell_mut((1, row)).set_value_string(*number);
        if !client.is_empty() {
            sheet.cell_mut((2, row)).set_value_string(*client);
        }
        sheet.cell_mut((3, row)).set_value_number(*amount);
        sheet.cell_mut((4, row)).set_value_bool(*paid);
        let due_cell = sheet.cell_mut((5, row));
        due_cell.set_value_number(*due);
        due_cell
            .style_mut()
            .number_format_mut()
            .set_format_code(umya_spreadsheet::NumberingFormat::FORMAT_DATE_YYYYMMDD);
    }
    let notes = book.new_sheet("Notes").unwrap();
    notes.cell_mut("B2").set_value_string("relancer Martin");
    umya_spreadsheet::writer::xlsx::write(&book, path).unwrap();
}

/// `<tmp>/data` (read: `factures.xlsx`, `notes.txt`, a link out), `<tmp>/out` (read, write),
/// `<tmp>/secret/s.xlsx` outside both.
fn tree() -> TempDir {
    let tmp = TempDir::new().unwrap();
    for dir in ["data", "out", "secret"] {
        fs::create_dir_all(tmp.path().join(dir)).unwrap();
    }
    workbook(&tmp.path().join("data/factures.xlsx"));
    workbook(&tmp.path().join("secret/s.xlsx"));
    fs::write(tmp.path().join("data/notes.txt"), "pas un classeur").unwrap();
    symlink(
        tmp.path().join("secret/s.xlsx"),
        tmp.path().join("data/lien.xlsx"),
    )
    .unwrap();
    tmp
}

fn tool(tmp: &TempDir) -> FnTool {
    excel(vec![
        Folder::new(
            "data",
            tmp.path().join("data"),
            Rights::without_approval([Right::Read]),
        ),
        Folder::new(
            "out",
            tmp.path().join("out"),
            Rights::without_approval([Right::Read, Right::Write]),
        ),
    ])
    .unwrap()
}

async fn call(tool: &FnTool, arguments: Value) -> Result<Value, ToolError> {
    tool.call(ctx(), arguments)
        .await
        .map(|output| output.data.unwrap())
}

async fn failed(tool: &FnTool, arguments: Value) -> ToolError {
    call(tool, arguments.clone())
        .await
        .expect_err(&format!("{arguments} should fail"))
}

#[tokio::test]
async fn sheets_are_listed_with_their_used_ranges() {
    let tmp = tree();
    let tool = tool(&tmp);
    let listed = call(
        &tool,
        json!({"op": "sheets", "folder": "data", "path": "factures.xlsx"}),
    )
    .await
    .unwrap();
    assert_eq!(
        listed["sheets"],
        json!([
            {"name": "Factures", "range": "A1:E5", "rows": 5, "columns": 5},
            {"name": "Notes", "range": "B2:B2", "rows": 1, "columns": 1},
        ])
    );
}

#[tokio::test]
async fn a_sheet_reads_as_typed_rows() {
    let tmp = tree();
    let tool = tool(&tmp);
    let read = call(
        &tool,
        json!({"op": "read", "folder": "data", "path": "factures.xlsx"}),
    )
    .await
    .unwrap();
    assert_eq!(read["sheet"], "Factures");
    assert_eq!(read["range"], "A1:E5");
    assert_eq!(read["truncated"], false);
    assert_eq!(
        read["rows"],
        json!([
            ["Numéro", "Client", "Montant", "Payée", "Échéance"],
            ["F-001", "Dupont", 1200.0, true, "2026-01-01"],
            ["F-002", "Martin", 350.5, false, "2026-02-01"],
            ["F-003", null, 980.0, false, "2026-03-01"],
            ["F-004", "Durand", 75.25, true, "2026-04-01"],
        ])
    );
    assert!(read.get("formulas").is_none(), "{read}");
    // A range of another sheet, past its used cells: cut at the last used row and column.
    let notes = call(
        &tool,
        json!({"op": "read", "folder": "data", "path": "factures.xlsx", "sheet": "Notes", "range": "a1:c9"}),
    )
    .await
    .unwrap();
    assert_eq!(notes["range"], "A1:B2");
    assert_eq!(
        notes["rows"],
        json!([[null, null], [null, "relancer Martin"]])
    );
}

#[tokio::test]
async fn a_read_is_capped_by_max_rows_and_says_so() {
    let tmp = tree();
    let tool = tool(&tmp);
    let read = call(
        &tool,
        json!({"op": "read", "folder": "data", "path": "factures.xlsx", "range": "B2:C5", "max_rows": 2}),
    )
    .await
    .unwrap();
    assert_eq!(read["range"], "B2:C3");
    assert_eq!(read["rows"], json!([["Dupont", 1200.0], ["Martin", 350.5]]));
    assert_eq!(read["total_rows"], 4);
    assert_eq!(read["truncated"], true);
    // A range past the used cells is cut at the last used column.
    let wide = call(
        &tool,
        json!({"op": "read", "folder": "data", "path": "factures.xlsx", "range": "A1:XFD1"}),
    )
    .await
    .unwrap();
    assert_eq!(wide["range"], "A1:E1");
    // A sheet used that wide is refused, not cut into nothing.
    let mut book = umya_spreadsheet::new_file();
    let sheet = book.sheet_mut(0).unwrap();
    sheet.cell_mut("A1").set_value_number(1);
    sheet.cell_mut("XFD1").set_value_number(2);
    umya_spreadsheet::writer::xlsx::write(&book, tmp.path().join("data/large.xlsx")).unwrap();
    let error = failed(
        &tool,
        json!({"op": "read", "folder": "data", "path": "large.xlsx"}),
    )
    .await;
    assert!(
        error.message.contains("A1:XFD1 is 16384 columns wide")
            && error.message.contains("ask for fewer columns"),
        "{}",
        error.message
    );
    // Part of it is read.
    let part = call(
        &tool,
        json!({"op": "read", "folder": "data", "path": "large.xlsx", "range": "XFC1:XFD1"}),
    )
    .await
    .unwrap();
    assert_eq!(part["rows"], json!([[null, 2.0]]));
}

#[tokio::test]
async fn formulas_are_written_into_a_copy_and_the_source_is_untouched() {
    let tmp = tree();
    let tool = tool(&tmp);
    let source = fs::read(tmp.path().join("data/factures.xlsx")).unwrap();
    let written = call(
        &tool,
        json!({
            "op": "write", "folder": "data", "path": "factures.xlsx",
            "output_folder": "out", "output_path": "synthese/factures-total.xlsx",
            "cells": [
                {"cell": "B7", "value": "Total"},
                {"cell": "C7", "formula": "=SUM(C2:C5)"},
                {"cell": "D7", "formula": "COUNTIF(D2:D5,FALSE)"},
                {"cell": "B2", "value": null},
                {"cell": "E7", "value": true},
            ]
        }),
    )
    .await
    .unwrap();
    assert_eq!(written["folder"], "out");
    assert_eq!(written["path"], "synthese/factures-total.xlsx");
    assert_eq!(written["cells_written"], 5);
    assert_eq!(written["created"], true);
    assert_eq!(written["recalculated"], false);
    assert_eq!(
        fs::read(tmp.path().join("data/factures.xlsx")).unwrap(),
        source
    );

    // The copy, read with calamine: the formulas as written, the values kept or set.
    let bytes = fs::read(tmp.path().join("out/synthese/factures-total.xlsx")).unwrap();
    let mut book: Xlsx<_> = calamine::open_workbook_from_rs(Cursor::new(bytes)).unwrap();
    let formulas = book.worksheet_formula("Factures").unwrap();
    assert_eq!(formulas.get_value((6, 2)).unwrap(), "SUM(C2:C5)");
    assert_eq!(formulas.get_value((6, 3)).unwrap(), "COUNTIF(D2:D5,FALSE)");
    let values = book.worksheet_range("Factures").unwrap();
    assert_eq!(
        values.get_value((6, 1)),
        Some(&Data::String("Total".into()))
    );
    assert_eq!(values.get_value((6, 4)), Some(&Data::Bool(true)));
    assert_eq!(values.get_value((2, 2)), Some(&Data::Float(350.5)));
    assert!(matches!(values.get_value((1, 1)), None | Some(Data::Empty)));
    assert_eq!(book.sheet_names(), ["Factures", "Notes"]);

    // And through the tool: the formulas come back beside the values.
    let read = call(
        &tool,
        json!({"op": "read", "folder": "out", "path": "synthese/factures-total.xlsx", "range": "B7:D7"}),
    )
    .await
    .unwrap();
    assert_eq!(
        read["formulas"],
        json!({"C7": "=SUM(C2:C5)", "D7": "=COUNTIF(D2:D5,FALSE)"})
    );
    assert_eq!(read["rows"][0][0], "Total");

    // The copy exists now: writing it again needs 'overwrite', which 'out' does not grant.
    let again = failed(
        &tool,
        json!({"op": "write", "folder": "data", "path": "factures.xlsx", "output_folder": "out",
               "output_path": "synthese/factures-total.xlsx", "cells": [{"cell": "A1", "value": 1}]}),
    )
    .await;
    assert_eq!(
        refusal_rule(&again),
        Some("folder-rights"),
        "{}",
        again.message
    );
    assert!(again.message.contains("'overwrite'"), "{}", again.message);
}

#[tokio::test]
async fn a_workbook_is_replaced_only_as_the_named_output_of_a_folder_granting_overwrite() {
    let tmp = tree();
    let tool = excel(vec![Folder::new(
        "data",
        tmp.path().join("data"),
        Rights::without_approval([Right::Read, Right::Overwrite]),
    )])
    .unwrap();
    assert_eq!(
        tool.spec().declarations.side_effects,
        SideEffects::Reversible
    );
    // No 'write': a new file is refused.
    let error = failed(
        &tool,
        json!({"op": "write", "folder": "data", "path": "factures.xlsx", "output_path": "new.xlsx",
               "cells": [{"cell": "A1", "value": 1}]}),
    )
    .await;
    assert_eq!(
        refusal_rule(&error),
        Some("folder-rights"),
        "{}",
        error.message
    );
    // The source itself, named as the output: replaced.
    let written = call(
        &tool,
        json!({"op": "write", "folder": "data", "path": "factures.xlsx", "output_path": "factures.xlsx",
               "cells": [{"cell": "A1", "value": "N°"}]}),
    )
    .await
    .unwrap();
    assert_eq!(written["created"], false);
    let read = call(
        &tool,
        json!({"op": "read", "folder": "data", "path": "factures.xlsx", "range": "A1"}),
    )
    .await
    .unwrap();
    assert_eq!(read["rows"], json!([["N°"]]));
}

#[tokio::test]
async fn read_only_folders_declare_no_side_effect() {
    let tmp = tree();
    let tool = excel(vec![Folder::new(
        "data",
        tmp.path().join("data"),
        Rights::without_approval([Right::Read]),
    )])
    .unwrap();
    let spec = tool.spec();
    assert_eq!(spec.name, "excel");
    assert_eq!(spec.declarations.side_effects, SideEffects::None);
    assert!(spec.declarations.idempotent);
    assert!(
        spec.description.contains("not recalculated"),
        "{}",
        spec.description
    );
}

#[tokio::test]
async fn refusals_name_their_rule() {
    let tmp = tree();
    let tool = tool(&tmp);
    let secret = tmp.path().join("secret/s.xlsx");
    for (arguments, rule) in [
        (
            json!({"op": "read", "folder": "archives", "path": "factures.xlsx"}),
            "declared-folder",
        ),
        (
            json!({"op": "read", "folder": "data", "path": "../secret/s.xlsx"}),
            "no-parent",
        ),
        (
            json!({"op": "read", "folder": "data", "path": secret.to_str().unwrap()}),
            "inside-roots",
        ),
        (
            json!({"op": "sheets", "folder": "data", "path": "lien.xlsx"}),
            "inside-roots",
        ),
        // 'data' is read-only: no copy there.
        (
            json!({"op": "write", "folder": "data", "path": "factures.xlsx", "output_path": "copie.xlsx",
                   "cells": [{"cell": "A1", "value": 1}]}),
            "folder-rights",
        ),
        (
            json!({"op": "write", "folder": "data", "path": "factures.xlsx", "output_folder": "out",
                   "output_path": "../data/copie.xlsx", "cells": [{"cell": "A1", "value": 1}]}),
            "no-parent",
        ),
    ] {
        let error = failed(&tool, arguments.clone()).await;
        assert_eq!(
            refusal_rule(&error),
            Some(rule),
            "{arguments}: {}",
            error.message
        );
        assert!(
            error
                .message
                .starts_with(&format!("refused by rule '{rule}'")),
            "{}",
            error.message
        );
    }
    assert!(!tmp.path().join("data/copie.xlsx").exists());
}

#[tokio::test]
async fn bad_arguments_are_clear_errors() {
    let tmp = tree();
    let tool = tool(&tmp);
    let write = |extra: Value| {
        let mut arguments = json!({"op": "write", "folder": "data", "path": "factures.xlsx",
                                   "output_folder": "out", "output_path": "copie.xlsx",
                                   "cells": [{"cell": "A1", "value": 1}]});
        for (key, value) in extra.as_object().unwrap() {
            arguments[key] = value.clone();
        }
        arguments
    };
    for (arguments, expected) in [
        (
            json!({"op": "read", "folder": "data", "path": "absent.xlsx"}),
            "'absent.xlsx' does not exist",
        ),
        (
            json!({"op": "read", "folder": "data", "path": "notes.txt"}),
            "'path' must end in .xlsx",
        ),
        (
            json!({"op": "read", "folder": "data", "path": "factures.xlsx", "sheet": "Clients"}),
            "'sheet': 'factures.xlsx' has no sheet named 'Clients'; its sheets are: 'Factures', 'Notes'",
        ),
        (
            json!({"op": "read", "folder": "data", "path": "factures.xlsx", "range": "A1:B"}),
            "'range' is 'A1:B', not an A1 reference ('B' lacks a row number)",
        ),
        (
            json!({"op": "read", "folder": "data", "path": "factures.xlsx", "max_rows": 0}),
            "'max_rows' must be at least 1",
        ),
        (
            json!({"op": "read", "folder": "data", "path": "factures.xlsx", "formula": "x"}),
            "invalid arguments: unknown field `formula`",
        ),
        (
            write(json!({"output_path": "copie.csv"})),
            "'output_path' is 'copie.csv': the copy is written as .xlsx",
        ),
        (write(json!({"cells": []})), "op 'write' needs 'cells'"),
        (
            write(json!({"cells": [{"cell": "A", "value": 1}]})),
            "'cells[0].cell': 'A' lacks a row number",
        ),
        (
            write(json!({"cells": [{"cell": "A1", "value": 1, "formula": "=1"}]})),
            "'cells[0]' (A1) has both 'value' and 'formula'",
        ),
        (
            write(json!({"cells": [{"cell": "A1", "value": [1, 2]}]})),
            "'cells[0].value' (A1) is [1,2]",
        ),
        (
            write(json!({"sheet": "Clients"})),
            "has no sheet named 'Clients'",
        ),
    ] {
        let error = failed(&tool, arguments.clone()).await;
        assert!(
            error.message.contains(expected),
            "{arguments}: {}",
            error.message
        );
        assert_eq!(refusal_rule(&error), None, "{}", error.message);
    }
    assert!(!tmp.path().join("out/copie.xlsx").exists());
    assert!(!tmp.path().join("out/copie.csv").exists());
}

#[tokio::test]
async fn a_file_that_is_not_a_workbook_is_an_error() {
    let tmp = tree();
    fs::write(tmp.path().join("data/faux.xlsx"), "pas un zip").unwrap();
    let tool = tool(&tmp);
    let error = failed(
        &tool,
        json!({"op": "read", "folder": "data", "path": "faux.xlsx"}),
    )
    .await;
    assert!(
        error
            .message
            .contains("'faux.xlsx' cannot be read as a workbook"),
        "{}",
        error.message
    );
}

/// The workbook of `examples/factures`: seven invoices, four unpaid (12 316,00 € TTC).
fn factures_example(path: &Path) {
    let mut book = umya_spreadsheet::new_file();
    let sheet = book.sheet_mut(0).unwrap();
    sheet.set_name("Factures");
    let header = [
        "Numéro",
        "Client",
        "Date",
        "Échéance",
        "Montant TTC",
        "Payée",
    ];
    for (column, title) in header.iter().enumerate() {
        sheet
            .cell_mut((column as u32 + 1, 1))
            .set_value_string(*title);
    }
    let invoices: [(&str, &str, f64, f64, f64, bool); 7] = [
        (
            "F-2026-001",
            "Boulangerie Martin",
            46_027.0,
            46_057.0,
            1250.0,
            true,
        ),
        (
            "F-2026-002",
            "Garage Dupont",
            46_034.0,
            46_064.0,
            3480.0,
            false,
        ),
        (
            "F-2026-003",
            "Cabinet Leroy",
            46_042.0,
            46_072.0,
            640.5,
            true,
        ),
        (
            "F-2026-004",
            "Fleurs & Co",
            46_055.0,
            46_085.0,
            2115.75,
            false,
        ),
        (
            "F-2026-005",
            "Hôtel du Parc",
            46_063.0,
            46_093.0,
            5900.0,
            false,
        ),
        (
            "F-2026-006",
            "Boulangerie Martin",
            46_071.0,
            46_101.0,
            1250.0,
            true,
        ),
        (
            "F-2026-007",
            "Garage Dupont",
            46_082.0,
            46_112.0,
            820.25,
            false,
        ),
    ];
    for (i, (number, client, date, due, amount, paid)) in invoices.iter().enumerate() {
        let row = i as u32 + 2;
        sheet.cell_mut((1, row)).set_value_string(*number);
        sheet.cell_mut((2, row)).set_value_string(*client);
        for (column, serial) in [(3, date), (4, due)] {
            let cell = sheet.cell_mut((column, row));
            cell.set_value_number(*serial);
            cell.style_mut()
                .number_format_mut()
                .set_format_code(umya_spreadsheet::NumberingFormat::FORMAT_DATE_YYYYMMDD);
        }
        sheet.cell_mut((5, row)).set_value_number(*amount);
        sheet.cell_mut((6, row)).set_value_bool(*paid);
    }
    umya_spreadsheet::writer::xlsx::write(&book, path).unwrap();
}

/// Every sheet's values, read with calamine.
fn values(path: &Path) -> Vec<(String, Vec<Vec<Data>>)> {
    let mut book: Xlsx<_> = calamine::open_workbook(path).unwrap();
    book.sheet_names()
        .into_iter()
        .map(|name| {
            let range = book.worksheet_range(&name).unwrap();
            (name, range.rows().map(<[Data]>::to_vec).collect())
        })
        .collect()
}

/// The committed `examples/factures/classeurs/factures.xlsx` holds what `factures_example`
/// builds; `LOOM_WRITE_EXAMPLE=1` writes it again.
#[test]
fn the_factures_example_workbook_is_the_one_built_here() {
    let committed = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/factures/classeurs/factures.xlsx");
    if std::env::var_os("LOOM_WRITE_EXAMPLE").is_some() {
        factures_example(&committed);
    }
    let tmp = TempDir::new().unwrap();
    let built = tmp.path().join("factures.xlsx");
    factures_example(&built);
    assert_eq!(values(&committed), values(&built));
}
