# Offline stand-in for rules_java: Bazel 4.2.3 would download it; re-export the native rules.
java_import = native.java_import
java_runtime = native.java_runtime
java_toolchain = native.java_toolchain
java_library = native.java_library
java_binary = native.java_binary
java_test = native.java_test
java_plugin = native.java_plugin
