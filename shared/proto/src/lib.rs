#![doc = include_str!("../README.md")]

pub mod common {
    pub mod v1 {
        tonic::include_proto!("common.v1");
    }
}

pub mod gateway {
    pub mod v1 {
        tonic::include_proto!("gateway.v1");
    }
}

pub mod orders {
    pub mod v1 {
        tonic::include_proto!("orders.v1");
    }
}

pub mod payment {
    pub mod v1 {
        tonic::include_proto!("payment.v1");
    }
}

pub mod bank {
    pub mod v1 {
        tonic::include_proto!("bank.v1");
    }
}

/// Encoded `FileDescriptorSet` of every package, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("descriptor");

pub mod json;
pub mod outcome;
pub mod validate;
