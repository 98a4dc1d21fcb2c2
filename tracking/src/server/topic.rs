//! A topic's handle in librdkafka, made once, and the send through it.
//!
//! `BaseProducer::send` names the topic on every message, and librdkafka finds a named topic
//! under the client's global write lock (`rd_kafka_topic_new0`), the lock its broker threads
//! read under: every event of every request took it. A handle made once is only reference
//! counted per message (`RD_KAFKA_VTYPE_RKT`).

use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::Arc;

use rdkafka::bindings as rdsys;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::Producer;
use rdkafka::util::IntoOpaque;

use super::producer::{Acks, IngestProducer};

/// One topic of the ingest producer. It keeps the producer alive: librdkafka's topic handles
/// must be destroyed before their client.
pub struct Topic {
    handle: NonNull<rdsys::rd_kafka_topic_t>,
    producer: IngestProducer,
}

// librdkafka's topic handles are reference counted and locked inside; any thread may produce
// through one.
unsafe impl Send for Topic {}
unsafe impl Sync for Topic {}

impl Topic {
    pub fn new(producer: &IngestProducer, name: &str) -> Result<Self, KafkaError> {
        let c_name = CString::new(name)?;
        // The producer's default topic settings, as a send by name uses. SAFETY: the client is
        // alive (`producer`), the name a C string that outlives the call.
        let handle = unsafe {
            rdsys::rd_kafka_topic_new(
                producer.client().native_ptr(),
                c_name.as_ptr(),
                std::ptr::null_mut(),
            )
        };
        let handle = NonNull::new(handle).ok_or_else(|| {
            // SAFETY: reads this thread's last librdkafka error.
            let code = unsafe { rdsys::rd_kafka_last_error() };
            KafkaError::ClientCreation(format!(
                "no handle for topic {name}: {}",
                RDKafkaErrorCode::from(code)
            ))
        })?;
        Ok(Self {
            handle,
            producer: Arc::clone(producer),
        })
    }

    pub fn producer(&self) -> &IngestProducer {
        &self.producer
    }

    /// Hands one record to librdkafka, which copies its key, payload and headers (name, value);
    /// `acks` counts its delivery report. Partitioned by the producer's partitioner.
    pub fn send(
        &self,
        key: Option<&[u8]>,
        payload: &[u8],
        headers: &[(&str, &[u8])],
        timestamp_ms: i64,
        acks: &Arc<Acks>,
    ) -> Result<(), KafkaError> {
        let (key_ptr, key_len) = key.map_or((std::ptr::null(), 0), |k| (k.as_ptr(), k.len()));
        // SAFETY (the calls below): the client and the topic handle are alive as long as `self`;
        // librdkafka copies the key, the payload and each header's bytes before it returns
        // (`RD_KAFKA_MSG_F_COPY`), takes the header list when the message is queued, and hands
        // `opaque` back once, in the delivery report, as rdkafka's `send` does.
        let native_headers = unsafe { rdsys::rd_kafka_headers_new(headers.len()) };
        for (name, value) in headers {
            // Only fails on a read-only list; this one is new.
            unsafe {
                rdsys::rd_kafka_header_add(
                    native_headers,
                    name.as_ptr().cast(),
                    name.len() as isize,
                    value.as_ptr().cast(),
                    value.len() as isize,
                )
            };
        }
        let opaque = Arc::clone(acks).into_ptr();
        let error = unsafe {
            rdsys::rd_kafka_producev(
                self.producer.client().native_ptr(),
                rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_RKT,
                self.handle.as_ptr(),
                rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_PARTITION,
                -1_i32, // RD_KAFKA_PARTITION_UA: the partitioner chooses
                rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_MSGFLAGS,
                rdsys::RD_KAFKA_MSG_F_COPY,
                rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_VALUE,
                payload.as_ptr(),
                payload.len(),
                rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_KEY,
                key_ptr,
                key_len,
                rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_OPAQUE,
                opaque,
                rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_TIMESTAMP,
                timestamp_ms,
                rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_HEADERS,
                native_headers,
                rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_END,
            )
        };
        if error == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            // The message owns the headers now.
            Ok(())
        } else {
            // Not queued: the headers and the opaque's reference are still ours, and no
            // delivery report will come.
            unsafe { rdsys::rd_kafka_headers_destroy(native_headers) };
            drop(unsafe { Arc::<Acks>::from_ptr(opaque) });
            Err(KafkaError::MessageProduction(error.into()))
        }
    }
}

impl Drop for Topic {
    fn drop(&mut self) {
        // SAFETY: made by `rd_kafka_topic_new`, destroyed once, before the client (`producer`).
        unsafe { rdsys::rd_kafka_topic_destroy(self.handle.as_ptr()) };
    }
}
