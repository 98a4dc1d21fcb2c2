//! The progress record a partition keeps in the ledger, written atomically with each batch's ids:
//! where the input resumes, where the output tail that the ledger has not yet seen begins, and
//! where the id changelog tail it has not yet loaded begins.
//!
//! Format version 2 (25 bytes): `0x02`, next input offset, next output offset, next changelog
//! offset (each i64 big-endian). Version 1 (17 bytes, no changelog offset) is still read: its
//! changelog offset is "none". An offset of -1 means "none yet".

const V1: u8 = 1;
const V1_LEN: usize = 17;
const V2: u8 = 2;
const V2_LEN: usize = 25;

/// Where one partition stands, as of the last batch the ledger recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// The first input offset not yet processed.
    pub next_input_offset: i64,
    /// The first output offset whose ids the ledger may not hold.
    pub next_output_offset: i64,
    /// The first id changelog offset whose ids the ledger may not hold: loading resumes here.
    pub next_changelog_offset: i64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("progress record of {len} bytes, version {version:?}, is not one this version can read")]
pub struct ProgressFormatError {
    pub len: usize,
    pub version: Option<u8>,
}

impl Progress {
    /// Nothing processed, published or loaded yet: what a partition being loaded from the
    /// changelog records until the whole load is done, so that a crash mid-load starts it over.
    pub const NONE: Progress = Progress {
        next_input_offset: -1,
        next_output_offset: -1,
        next_changelog_offset: -1,
    };

    pub fn encode(&self) -> [u8; V2_LEN] {
        let mut out = [0u8; V2_LEN];
        out[0] = V2;
        out[1..9].copy_from_slice(&self.next_input_offset.to_be_bytes());
        out[9..17].copy_from_slice(&self.next_output_offset.to_be_bytes());
        out[17..25].copy_from_slice(&self.next_changelog_offset.to_be_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, ProgressFormatError> {
        let field = |at: usize| i64::from_be_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        match (bytes.first().copied(), bytes.len()) {
            (Some(V1), V1_LEN) => Ok(Self {
                next_input_offset: field(1),
                next_output_offset: field(9),
                next_changelog_offset: -1,
            }),
            (Some(V2), V2_LEN) => Ok(Self {
                next_input_offset: field(1),
                next_output_offset: field(9),
                next_changelog_offset: field(17),
            }),
            (version, len) => Err(ProgressFormatError { len, version }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_other_formats() {
        let p = Progress {
            next_input_offset: 42,
            next_output_offset: -1,
            next_changelog_offset: 7,
        };
        assert_eq!(Progress::decode(&p.encode()).unwrap(), p);
        // Known vectors: the format is on disk, so it must not change by accident.
        let v2 = Progress {
            next_input_offset: 1,
            next_output_offset: 2,
            next_changelog_offset: 3,
        }
        .encode();
        assert_eq!(
            v2,
            [2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3]
        );
        let v1 = [1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2];
        assert_eq!(
            Progress::decode(&v1).unwrap(),
            Progress {
                next_input_offset: 1,
                next_output_offset: 2,
                next_changelog_offset: -1
            },
            "a version-1 record (written before the changelog) still reads"
        );
        assert!(Progress::decode(&[]).is_err());
        let mut wrong_version = p.encode();
        wrong_version[0] = 3;
        assert_eq!(
            Progress::decode(&wrong_version).unwrap_err().version,
            Some(3)
        );
        assert!(
            Progress::decode(&v2[..17]).is_err(),
            "a version-2 header with a version-1 length"
        );
    }
}
