;; abi_v2: speaks another version of the ABI.
(module
  (memory (export "memory") 1)
  (func (export "policy_abi_version") (result i32) (i32.const 2))
  (func (export "policy_buffer") (param i32) (result i32) (i32.const 1024))
  (func (export "policy_eval") (param i32) (result i64) (i64.const 0)))
