//! A file's bytes as the body of an upload ([`super::BotApi::send_file`]):
//! read from the open descriptor in large chunks while the request goes,
//! never whole in memory, and never sent other than whole and as they were
//! when the upload began.
//!
//! The bytes are read with `pread` on the blocking pool, [`CHUNK`] at a
//! time: one hop to the pool per chunk (a 4 KiB reader through
//! `tokio::fs::File` made 5,120 of them for 20 MiB, and cost four fifths
//! of the upload), and a chunk goes to the HTTP client as it was read,
//! with no copy of the relay's. A file
//! whose length is not the one checked, or that changed while it was read
//! (its length or its modification time moved), ends the body with an
//! error before its last byte: the request never completes, so nothing is
//! posted, and the caller learns why from [`FileBody::failed`].

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt as _;
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use bytes::Bytes;

/// How much is read at once: few hops to the blocking pool (20 for the
/// 20 MiB a bench file has), and little memory held per upload.
const CHUNK: u64 = 1024 * 1024;

/// Why a file's bytes did not all go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.as_reason())]
pub enum Unsent {
    /// Its length is not the one checked, or it was written to while it was
    /// read: what would go is not the file as it was, or not all of it.
    Changed,
    Unreadable,
}

impl Unsent {
    /// Why, as [`super::TelegramError::Refused`] says it.
    pub fn as_reason(self) -> &'static str {
        match self {
            Self::Changed => {
                "the file changed while it was uploaded, so none of it was posted; send it again once it is written"
            }
            Self::Unreadable => "the file to upload cannot be read",
        }
    }
}

/// An upload's body and, once it failed, why.
pub struct FileBody {
    pub body: reqwest::Body,
    pub failed: Arc<OnceLock<Unsent>>,
}

/// What tells a file's bytes apart from the same file's later ones, short
/// of reading them again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
}

impl Stamp {
    fn of(file: &File) -> Result<Self, Unsent> {
        let meta = file.metadata().map_err(|_| Unsent::Unreadable)?;
        Ok(Self {
            len: meta.len(),
            modified: meta.modified().ok(),
        })
    }
}

/// Where a body's reading is: the next offset, and the file as it was
/// when its first byte was read.
struct Reading {
    file: Arc<File>,
    len: u64,
    offset: u64,
    began: Option<Stamp>,
}

impl Reading {
    /// Reads the next chunk; checks the file before the first and before
    /// the last goes.
    fn next_chunk(&mut self) -> Result<Bytes, Unsent> {
        let began = match self.began {
            Some(began) => began,
            None => {
                let began = Stamp::of(&self.file)?;
                if began.len != self.len {
                    return Err(Unsent::Changed);
                }
                self.began = Some(began);
                began
            }
        };
        let size = CHUNK.min(self.len - self.offset);
        // `size` is at most CHUNK, which fits in usize.
        let mut chunk = vec![0u8; size as usize];
        self.file
            .read_exact_at(&mut chunk, self.offset)
            .map_err(|e| match e.kind() {
                io::ErrorKind::UnexpectedEof => Unsent::Changed,
                _ => Unsent::Unreadable,
            })?;
        self.offset += size;
        if self.offset == self.len && Stamp::of(&self.file)? != began {
            return Err(Unsent::Changed);
        }
        Ok(Bytes::from(chunk))
    }
}

/// The first `len` bytes of `file`, from its start, as a body: `len` is
/// what the file's checks found, and the whole file it must still be.
/// Every attempt reads through a descriptor of its own.
pub fn file_body(file: &File, len: u64) -> io::Result<FileBody> {
    let failed = Arc::new(OnceLock::new());
    let chunks = chunks(file, len, failed.clone())?;
    Ok(FileBody {
        body: reqwest::Body::wrap_stream(chunks),
        failed,
    })
}

/// The chunks of [`file_body`]; a failure is set in `failed` before the
/// stream ends with it.
fn chunks(
    file: &File,
    len: u64,
    failed: Arc<OnceLock<Unsent>>,
) -> io::Result<impl futures::Stream<Item = io::Result<Bytes>> + Send + 'static> {
    let reading = Reading {
        file: Arc::new(file.try_clone()?),
        len,
        offset: 0,
        began: None,
    };
    Ok(futures::stream::try_unfold(reading, move |mut reading| {
        let failed = failed.clone();
        async move {
            if reading.offset == reading.len {
                return Ok(None);
            }
            let read = tokio::task::spawn_blocking(move || {
                let chunk = reading.next_chunk();
                (reading, chunk)
            })
            .await;
            let unsent = match read {
                Ok((reading, Ok(chunk))) => return Ok(Some((chunk, reading))),
                Ok((_, Err(unsent))) => unsent,
                Err(_) => Unsent::Unreadable,
            };
            let _ = failed.set(unsent);
            Err(io::Error::other(unsent))
        }
    }))
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use futures::StreamExt as _;

    use super::*;

    fn file_of(len: usize) -> (tempfile::NamedTempFile, Vec<u8>) {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let mut file = tempfile::NamedTempFile::new().expect("a temporary file");
        file.write_all(&bytes).expect("written");
        (file, bytes)
    }

    /// Reads the first `len` bytes of `file` as the HTTP client would,
    /// calling `between` after the first chunk: the bytes, or why not.
    async fn read_all(file: &File, len: usize, between: impl FnOnce()) -> Result<Vec<u8>, Unsent> {
        let failed = Arc::new(OnceLock::new());
        let stream = chunks(file, len as u64, failed.clone()).expect("a body");
        let mut stream = std::pin::pin!(stream);
        let mut read = Vec::new();
        let mut between = Some(between);
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(chunk) => read.extend_from_slice(&chunk),
                Err(_) => return Err(*failed.get().expect("a failure says why")),
            }
            if let Some(between) = between.take() {
                between();
            }
        }
        assert!(failed.get().is_none(), "a body that ended whole failed");
        Ok(read)
    }

    #[tokio::test]
    async fn a_file_goes_whole_in_chunks_of_the_bounded_size() {
        let len = 2 * CHUNK as usize + 5;
        let (file, bytes) = file_of(len);
        let mut sizes = Vec::new();
        let stream = chunks(file.as_file(), len as u64, Arc::default()).expect("a body");
        let mut stream = std::pin::pin!(stream);
        let mut read = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.expect("a chunk");
            sizes.push(chunk.len());
            read.extend_from_slice(&chunk);
        }
        assert_eq!(sizes, [CHUNK as usize, CHUNK as usize, 5]);
        assert!(read == bytes, "the bytes arrived other than written");
        let whole = read_all(file.as_file(), len, || ()).await;
        assert!(whole == Ok(bytes), "the bytes arrived other than written");
    }

    #[tokio::test]
    async fn a_file_that_shrank_or_grew_after_its_check_is_not_sent() {
        for now in [1000, 3000] {
            let (file, _) = file_of(2000);
            file.as_file().set_len(now).expect("resized");
            let read = read_all(file.as_file(), 2000, || ()).await;
            assert_eq!(read, Err(Unsent::Changed), "{now}");
        }
    }

    #[tokio::test]
    async fn a_file_cut_short_while_it_is_read_is_not_sent_truncated() {
        let len = CHUNK as usize + 100;
        let (file, _) = file_of(len);
        let cut = || file.as_file().set_len(CHUNK + 50).expect("cut");
        assert_eq!(
            read_all(file.as_file(), len, cut).await,
            Err(Unsent::Changed)
        );
    }

    #[tokio::test]
    async fn a_file_that_grew_while_it_is_read_is_not_sent_cut_off() {
        let len = CHUNK as usize + 100;
        let (file, _) = file_of(len);
        let grow = || {
            let mut appending = std::fs::OpenOptions::new()
                .append(true)
                .open(file.path())
                .expect("opened");
            appending.write_all(b"more").expect("appended");
        };
        assert_eq!(
            read_all(file.as_file(), len, grow).await,
            Err(Unsent::Changed)
        );
    }

    #[tokio::test]
    async fn a_file_rewritten_in_place_while_it_is_read_is_not_sent_garbled() {
        let len = CHUNK as usize + 100;
        let (file, _) = file_of(len);
        let rewrite = || {
            file.as_file().write_all_at(b"new", 10).expect("rewritten");
            // The kernel's file clock ticks coarsely: set the time a write
            // moves it to, so the test does not depend on the tick.
            let later = SystemTime::now() + std::time::Duration::from_secs(5);
            file.as_file().set_modified(later).expect("touched");
        };
        let read = read_all(file.as_file(), len, rewrite).await;
        assert_eq!(read, Err(Unsent::Changed));
    }
}
