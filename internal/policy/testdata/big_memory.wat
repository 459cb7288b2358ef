;; big_memory: asks for 128 MiB of memory at start (the default cap is 64).
(module
  (memory (export "memory") 2048)
  (func (export "policy_abi_version") (result i32) (i32.const 1))
  (func (export "policy_buffer") (param i32) (result i32) (i32.const 1024))
  (func (export "policy_eval") (param i32) (result i64) (i64.const 0)))
