;; bad_import: imports a function the host does not provide.
(module
  (import "env" "launch_missiles" (func $launch))
  (memory (export "memory") 1)
  (func (export "policy_abi_version") (result i32) (i32.const 1))
  (func (export "policy_buffer") (param i32) (result i32) (i32.const 1024))
  (func (export "policy_eval") (param i32) (result i64) (call $launch) (i64.const 0)))
