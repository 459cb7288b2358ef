;; outside: the output pointer is past the end of memory.
(module
  (memory (export "memory") 1)
  (func (export "policy_abi_version") (result i32) (i32.const 1))
  (func (export "policy_buffer") (param i32) (result i32) (i32.const 1024))
  (func (export "policy_eval") (param i32) (result i64)
    (i64.or (i64.shl (i64.const 65530) (i64.const 32)) (i64.const 100))))
