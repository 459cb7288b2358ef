;; recurse: policy_eval recurses without a loop.
(module
  (memory (export "memory") 1)
  (func (export "policy_abi_version") (result i32) (i32.const 1))
  (func (export "policy_buffer") (param i32) (result i32) (i32.const 1024))
  (func $down (param $n i32) (result i32)
    (i32.add (call $down (i32.add (local.get $n) (i32.const 1))) (i32.const 1)))
  (func (export "policy_eval") (param i32) (result i64)
    (i64.extend_i32_u (call $down (i32.const 0)))))
