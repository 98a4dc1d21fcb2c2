//! The progress record a partition keeps in the ledger, written atomically with each batch's ids:
//! where the input resumes and where the output tail that the ledger has not yet seen begins.
//!
//! Format (version 1, 17 bytes): `0x01`, next input offset (i64 big-endian), next output offset
//! (i64 big-endian). An offset of -1 means "none yet".

/// The first byte of a version-1 progress record.
const VERSION: u8 = 1;
const LEN: usize = 17;

/// Where one partition stands, as of the last batch the ledger recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// The first input offset not yet processed.
    pub next_input_offset: i64,
    /// The first output offset whose ids the ledger may not hold: recovery replays from here.
    pub next_output_offset: i64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("progress record of {len} bytes, version {version:?}, is not one this version can read")]
pub struct ProgressFormatError {
    pub len: usize,
    pub version: Option<u8>,
}

impl Progress {
    pub fn encode(&self) -> [u8; LEN] {
        let mut out = [0u8; LEN];
        out[0] = VERSION;
        out[1..9].copy_from_slice(&self.next_input_offset.to_be_bytes());
        out[9..17].copy_from_slice(&self.next_output_offset.to_be_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, ProgressFormatError> {
        if bytes.len() != LEN || bytes[0] != VERSION {
            return Err(ProgressFormatError { len: bytes.len(), version: bytes.first().copied() });
        }
        let i = i64::from_be_bytes(bytes[1..9].try_into().expect("8 bytes"));
        let o = i64::from_be_bytes(bytes[9..17].try_into().expect("8 bytes"));
        Ok(Self { next_input_offset: i, next_output_offset: o })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_other_formats() {
        let p = Progress { next_input_offset: 42, next_output_offset: -1 };
        assert_eq!(Progress::decode(&p.encode()).unwrap(), p);
        // A known vector: the format is on disk, so it must not change by accident.
        assert_eq!(
            Progress { next_input_offset: 1, next_output_offset: 2 }.encode(),
            [1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]
        );
        assert!(Progress::decode(&[]).is_err());
        let mut wrong_version = p.encode();
        wrong_version[0] = 2;
        assert_eq!(Progress::decode(&wrong_version).unwrap_err().version, Some(2));
    }
}
