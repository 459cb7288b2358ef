;; garbage: the output is not JSON.
(module
  (memory (export "memory") 1)
  (data (i32.const 16) "definitely not json")
  (func (export "policy_abi_version") (result i32) (i32.const 1))
  (func (export "policy_buffer") (param i32) (result i32) (i32.const 1024))
  (func (export "policy_eval") (param i32) (result i64)
    (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 19))))
