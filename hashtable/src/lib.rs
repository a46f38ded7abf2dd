//! A DLHT-style closed-addressing concurrent hashtable (being written).
#![cfg_attr(not(any(test, feature = "std")), no_std)]
