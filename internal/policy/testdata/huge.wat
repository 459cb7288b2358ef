;; huge: the output is 100000 bytes, above the 64 KiB limit.
(module
  (memory (export "memory") 4)
  (func (export "policy_abi_version") (result i32) (i32.const 1))
  (func (export "policy_buffer") (param i32) (result i32) (i32.const 1024))
  (func (export "policy_eval") (param i32) (result i64)
    (i64.or (i64.shl (i64.const 65536) (i64.const 32)) (i64.const 100000))))
