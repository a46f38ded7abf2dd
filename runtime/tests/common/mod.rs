pub mod declock_shm;
