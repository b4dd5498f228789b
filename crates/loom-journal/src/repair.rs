//! Recovering a JSONL journal that holds an unreadable line: reading what can be read
//! (`salvage`), and setting unreadable lines aside (`set_aside`): their bytes are appended to
//! `<session>.jsonl.corrupt` and made durable, then the journal is written anew beside itself with
//! a replacement event at each such line's seq, synced, and renamed over the old file.

use std::{
    fs::{self, OpenOptions},
    io::{BufRead, BufReader, Read, Seek, SeekFrom, Write},
};

use loom_core::{
    event::EventReadError,
    journal::check_set_aside,
    ports::{Salvage, SetAside, StoreError, UnreadableLine},
};
use tracing::warn;

use crate::{
    index::envelope_hint,
    jsonl::{EXTENSION, Journal, forget, io_error, sync_dir},
};

impl Journal {
    /// The side file keeping the bytes set aside.
    pub(crate) fn aside_path(&self) -> std::path::PathBuf {
        self.path.with_extension(format!("{EXTENSION}.corrupt"))
    }

    /// Every complete line read: the events that read back and the lines that do not.
    pub(crate) fn salvage(&self) -> Result<Salvage, StoreError> {
        let mut salvage = Salvage {
            path: self.path.display().to_string(),
            aside: self
                .aside_path()
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default(),
            ..Salvage::default()
        };
        let Some(file) = self.open_shared()? else {
            return Ok(salvage);
        };
        let mut reader = BufReader::with_capacity(64 * 1024, &file);
        let mut line = Vec::new();
        let mut line_no = 0u64;
        loop {
            line.clear();
            if reader.read_until(b'\n', &mut line).map_err(self.io())? == 0
                || line.pop() != Some(b'\n')
            {
                // The end, or a torn last line (an interrupted write, not an unreadable line).
                return Ok(salvage);
            }
            line_no += 1;
            match self.line_event(&line, line_no) {
                Ok(event) => salvage.events.push(event),
                Err(error) => salvage.unreadable.push(UnreadableLine {
                    line: line_no,
                    run_id: envelope_hint(&line)
                        .map(|(_, run)| run.to_owned())
                        .filter(|run| loom_core::ids::is_safe_id(run)),
                    bytes: line.clone(),
                    error,
                }),
            }
        }
    }

    /// The event of line `line_no` (which must carry that seq).
    pub(crate) fn line_event(
        &self,
        bytes: &[u8],
        line_no: u64,
    ) -> Result<loom_core::Event, EventReadError> {
        self.line_event_shared(bytes, line_no)
            .map(std::sync::Arc::unwrap_or_clone)
    }

    /// [`Journal::line_event`], the event shared with the store's cache.
    pub(crate) fn line_event_shared(
        &self,
        bytes: &[u8],
        line_no: u64,
    ) -> Result<std::sync::Arc<loom_core::Event>, EventReadError> {
        let event = self.decode_shared(bytes)?;
        if event.seq == line_no {
            Ok(event)
        } else {
            Err(EventReadError::Invalid {
                reason: format!("seq {} where {line_no} was expected", event.seq),
                event_id: event.event_id.clone(),
                seq: event.seq,
            })
        }
    }

    /// Sets the unreadable lines `lines` aside, all or nothing (see the module documentation).
    pub(crate) fn set_lines_aside(&self, lines: Vec<SetAside>) -> Result<(), StoreError> {
        check_set_aside(&self.tenant_id, &self.session_id, &lines)?;
        if lines.is_empty() {
            return Ok(());
        }
        let shown = self.path.display().to_string();
        if !self.path.exists() {
            return Err(StoreError::Invalid(format!("{shown} does not exist")));
        }
        let mut file = self.open_locked()?;
        let mut bytes = Vec::new();
        file.seek(SeekFrom::Start(0))
            .and_then(|_| file.read_to_end(&mut bytes))
            .map_err(self.io())?;
        // Complete lines (without their newline), then the torn tail, kept as it is.
        let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let mut rows: Vec<Vec<u8>> = bytes[..complete]
            .split(|&b| b == b'\n')
            .map(<[u8]>::to_vec)
            .collect();
        rows.pop();
        let torn = &bytes[complete..];
        let mut kept = Vec::new();
        for aside in &lines {
            let index = usize::try_from(aside.line)
                .ok()
                .and_then(|line| line.checked_sub(1))
                .filter(|&index| index < rows.len());
            let Some(index) = index else {
                return Err(StoreError::Invalid(format!(
                    "{shown} has no line {}",
                    aside.line
                )));
            };
            if rows[index] != aside.bytes {
                return Err(StoreError::Invalid(format!(
                    "line {} of {shown} changed since it was read: read the journal again",
                    aside.line
                )));
            }
            if self.line_event(&rows[index], aside.line).is_ok() {
                return Err(StoreError::Invalid(format!(
                    "line {} of {shown} reads back: only an unreadable line is set aside",
                    aside.line
                )));
            }
            kept.extend_from_slice(&aside.bytes);
            kept.push(b'\n');
            rows[index] = aside.replacement.to_json().into_bytes();
        }
        self.keep_aside(&kept)?;
        let mut rewritten = Vec::with_capacity(bytes.len());
        for row in &rows {
            rewritten.extend_from_slice(row);
            rewritten.push(b'\n');
        }
        rewritten.extend_from_slice(torn);
        self.replace_with(&rewritten)?;
        drop(file);
        if let Some(dir) = self.path.parent() {
            forget(
                &crate::index::RunIndex::new(dir.to_path_buf()),
                &self.path,
                &self.session_id,
            );
        }
        warn!(
            path = %shown,
            lines = ?lines.iter().map(|a| a.line).collect::<Vec<_>>(),
            moved_to = %self.aside_path().display(),
            "unreadable journal lines set aside and replaced by session.repaired events"
        );
        Ok(())
    }

    /// Appends `bytes` to the side file and makes them durable.
    pub(crate) fn keep_aside(&self, bytes: &[u8]) -> Result<(), StoreError> {
        let aside = self.aside_path();
        let mut out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&aside)
            .map_err(io_error(&aside))?;
        let was_empty = out.metadata().map_err(io_error(&aside))?.len() == 0;
        out.write_all(bytes)
            .and_then(|()| out.sync_data())
            .map_err(io_error(&aside))?;
        if was_empty && let Some(dir) = aside.parent() {
            sync_dir(dir)?;
        }
        Ok(())
    }

    /// Writes `bytes` to a new file beside the journal, syncs it and renames it over the
    /// journal (a crash leaves the old journal or the new one, never a mix).
    fn replace_with(&self, bytes: &[u8]) -> Result<(), StoreError> {
        let next = self.path.with_extension(format!("{EXTENSION}.repair"));
        let written = fs::File::create(&next)
            .and_then(|mut out| out.write_all(bytes).and_then(|()| out.sync_all()))
            .map_err(io_error(&next));
        if let Err(err) = written {
            let _ = fs::remove_file(&next);
            return Err(err);
        }
        fs::rename(&next, &self.path).map_err(|err| {
            let _ = fs::remove_file(&next);
            io_error(&self.path)(err)
        })?;
        if let Some(dir) = self.path.parent() {
            sync_dir(dir)?;
        }
        Ok(())
    }
}
