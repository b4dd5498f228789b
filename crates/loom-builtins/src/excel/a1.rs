//! A1 references: a cell (`B7`, `$B$7`) or a rectangle (`A1:D20`), 0-based internally.

use std::fmt;

/// The last column a sheet has (`XFD`, 0-based 16 383).
const MAX_COLUMN: u32 = 16_383;
/// The last row a sheet has (1 048 576, 0-based 1 048 575).
const MAX_ROW: u32 = 1_048_575;

/// One cell, 0-based row and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Cell {
    /// 0-based row (row `1` is 0).
    pub(crate) row: u32,
    /// 0-based column (`A` is 0).
    pub(crate) column: u32,
}

/// A rectangle of cells, `start` its top-left corner and `end` its bottom-right one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Area {
    /// Top-left corner.
    pub(crate) start: Cell,
    /// Bottom-right corner.
    pub(crate) end: Cell,
}

impl Cell {
    /// A cell from its 0-based row and column.
    pub(crate) fn new(row: u32, column: u32) -> Cell {
        Cell { row, column }
    }

    /// Parses `B7` (or `$B$7`, any case); the error says what is wrong with `text`.
    pub(crate) fn parse(text: &str) -> Result<Cell, String> {
        let bare: String = text.chars().filter(|c| *c != '$').collect();
        let split = bare
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(bare.len());
        let (letters, digits) = bare.split_at(split);
        if letters.is_empty() {
            return Err(format!("'{text}' has no column letters"));
        }
        if digits.is_empty() {
            return Err(format!("'{text}' lacks a row number"));
        }
        if !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("'{text}' is not a column and a row number"));
        }
        let mut column: u32 = 0;
        for letter in letters.bytes() {
            let value = u32::from(letter.to_ascii_uppercase() - b'A') + 1;
            column = column
                .checked_mul(26)
                .and_then(|c| c.checked_add(value))
                .filter(|c| *c <= MAX_COLUMN + 1)
                .ok_or_else(|| format!("'{text}': the column is past XFD, the last one"))?;
        }
        let row: u32 = digits
            .parse()
            .ok()
            .filter(|row| (1..=MAX_ROW + 1).contains(row))
            .ok_or_else(|| format!("'{text}': the row must be between 1 and 1048576"))?;
        Ok(Cell {
            row: row - 1,
            column: column - 1,
        })
    }
}

impl fmt::Display for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut letters = Vec::new();
        let mut n = self.column + 1;
        while n > 0 {
            let rem = (n - 1) % 26;
            // `rem` is below 26, so the byte is an ASCII capital.
            letters.push(char::from(b'A' + rem as u8));
            n = (n - 1) / 26;
        }
        let column: String = letters.into_iter().rev().collect();
        write!(f, "{column}{}", self.row + 1)
    }
}

impl Area {
    /// Parses `A1:D20` or a single cell `B7`; the corners may come in any order. The error
    /// names `text` and what is wrong with it.
    pub(crate) fn parse(text: &str) -> Result<Area, String> {
        let trimmed = text.trim();
        let explain = |why: String| {
            format!(
                "'range' is '{text}', not an A1 reference ({why}); write a cell like 'B7' or \
                 a rectangle like 'A1:D20'"
            )
        };
        let (first, second) = match trimmed.split_once(':') {
            Some((first, second)) => (first, second),
            None => (trimmed, trimmed),
        };
        let a = Cell::parse(first).map_err(explain)?;
        let b = Cell::parse(second).map_err(explain)?;
        Ok(Area {
            start: Cell::new(a.row.min(b.row), a.column.min(b.column)),
            end: Cell::new(a.row.max(b.row), a.column.max(b.column)),
        })
    }

    /// Whether `cell` is inside.
    pub(crate) fn contains(&self, cell: Cell) -> bool {
        (self.start.row..=self.end.row).contains(&cell.row)
            && (self.start.column..=self.end.column).contains(&cell.column)
    }

    /// Its number of columns.
    pub(crate) fn width(&self) -> u64 {
        u64::from(self.end.column - self.start.column) + 1
    }

    /// Its number of rows.
    pub(crate) fn height(&self) -> u64 {
        u64::from(self.end.row - self.start.row) + 1
    }
}

impl fmt::Display for Area {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.start, self.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_round_trip() {
        for (text, row, column) in [
            ("A1", 0, 0),
            ("b7", 6, 1),
            ("$Z$10", 9, 25),
            ("AA1", 0, 26),
            ("AZ3", 2, 51),
            ("XFD1048576", MAX_ROW, MAX_COLUMN),
        ] {
            let cell = Cell::parse(text).unwrap();
            assert_eq!(cell, Cell::new(row, column), "{text}");
            assert_eq!(cell.to_string(), text.replace('$', "").to_uppercase());
        }
    }

    #[test]
    fn malformed_references_say_what_is_wrong() {
        for (text, why) in [
            ("A1:B", "'B' lacks a row number"),
            ("12", "has no column letters"),
            ("A0", "between 1 and 1048576"),
            ("XFE1", "past XFD"),
            ("A1B", "not a column and a row number"),
            ("", "has no column letters"),
        ] {
            let error = Area::parse(text).unwrap_err();
            assert!(error.contains(why), "{text}: {error}");
            assert!(error.contains("'range'"), "{error}");
        }
    }

    #[test]
    fn areas_are_normalised() {
        let area = Area::parse("D20:A1").unwrap();
        assert_eq!(area.to_string(), "A1:D20");
        assert_eq!((area.width(), area.height()), (4, 20));
        assert!(area.contains(Cell::new(19, 3)) && !area.contains(Cell::new(20, 0)));
        assert_eq!(Area::parse("C3").unwrap().to_string(), "C3:C3");
    }
}
