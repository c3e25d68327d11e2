//! The metadata log: load and replay of arbitrary file bytes, and
//! decode_line(encode_line(r)) == r for structured records
//! (`fjord::fuzzing::metadata_log`, `metadata_record_round_trip`).
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use fjord::metadata::MetadataRecord;
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;

#[derive(Arbitrary, Debug)]
enum Record {
    CreateTopic {
        name: String,
        id: [u8; 16],
        shards: Vec<usize>,
        configs: BTreeMap<String, String>,
    },
    DeleteTopic {
        name: String,
    },
    AddPartitions {
        name: String,
        shards: Vec<usize>,
    },
    SetTopicConfigs {
        name: String,
        configs: BTreeMap<String, String>,
    },
    ProducerIdBlock {
        next: i64,
    },
}

impl From<Record> for MetadataRecord {
    fn from(r: Record) -> MetadataRecord {
        match r {
            Record::CreateTopic {
                name,
                id,
                shards,
                configs,
            } => MetadataRecord::CreateTopic {
                name,
                id,
                shards,
                configs,
            },
            Record::DeleteTopic { name } => MetadataRecord::DeleteTopic { name },
            Record::AddPartitions { name, shards } => {
                MetadataRecord::AddPartitions { name, shards }
            }
            Record::SetTopicConfigs { name, configs } => {
                MetadataRecord::SetTopicConfigs { name, configs }
            }
            Record::ProducerIdBlock { next } => MetadataRecord::ProducerIdBlock { next },
        }
    }
}

fuzz_target!(|data: &[u8]| {
    fjord::fuzzing::metadata_log(data);
    let mut u = Unstructured::new(data);
    if let Ok(records) = Vec::<Record>::arbitrary(&mut u) {
        for r in records {
            fjord::fuzzing::metadata_record_round_trip(&r.into());
        }
    }
});
