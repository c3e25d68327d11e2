//! (in progress) The partition log; see issue "Partition log".

pub mod dump;
