// vitest configuration for the E2B upstream measurement's template tests
// (scripts/e2b-upstream.sh): the JS SDK's own `template` project settings
// (tests/template, 180 s per test), one file at a time against one daemon.
// Test harness only.
import { defineConfig } from 'vitest/config'

export default defineConfig({
  test: {
    include: ['tests/template/**/*.test.ts'],
    isolate: true,
    globals: false,
    testTimeout: 180_000,
    environment: 'node',
    setupFiles: ['tests/globalFetchFallback.setup.ts'],
    fileParallelism: false,
    env: { ...(process.env as Record<string, string>) },
  },
})
